"""Shared test setup: the `gpu` marker skips without a Hopper GPU."""

import pytest


def _hopper() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _hopper():
        return
    skip = pytest.mark.skip(reason="needs a Hopper (sm_90) GPU; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
