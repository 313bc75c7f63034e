"""Cases for tests/test_conftest_spawns.py (not collected by the suite: its name is no test_*.py):
a test that starts a process without the `spawns` marker, one with it, one that starts none."""

import subprocess
import sys

import pytest


def test_starts_a_process_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.spawns
def test_starts_a_process_marked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_starts_none():
    assert sum(range(4)) == 6
