"""Paired values: how an epilogue sees two adjacent columns as one element.

On the GPU quack hands the function `quack.epilogue.math.Pair` values; on the CPU the
emulator hands it `TorchPair`. `pack`/`unpack` accept either, so one source runs in both
places.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from epiforge.primitives.graph import traced


class TorchPair(NamedTuple):
    """Two lanes (even column, odd column) of torch tensors with lane-wise + - *;
    a plain value broadcasts to both lanes (same contract as quack's Pair)."""

    a: object
    b: object

    @staticmethod
    def _lanes(v):
        return (v[0], v[1]) if isinstance(v, tuple) else (v, v)

    def __add__(self, other):
        o = TorchPair._lanes(other)
        return TorchPair(self.a + o[0], self.b + o[1])

    __radd__ = __add__

    def __mul__(self, other):
        o = TorchPair._lanes(other)
        return TorchPair(self.a * o[0], self.b * o[1])

    __rmul__ = __mul__

    def __sub__(self, other):
        o = TorchPair._lanes(other)
        return TorchPair(self.a - o[0], self.b - o[1])

    def __rsub__(self, other):
        o = TorchPair._lanes(other)
        return TorchPair(o[0] - self.a, o[1] - self.b)

    def __neg__(self):
        return TorchPair(-self.a, -self.b)


def is_torch(*values) -> bool:
    """True when any value (or lane of a pair) is a torch tensor: the CPU emulator's side."""
    for v in values:
        if isinstance(v, torch.Tensor):
            return True
        if isinstance(v, tuple) and any(isinstance(x, torch.Tensor) for x in v):
            return True
    return False


@traced
def unpack(value):
    """Split a paired value into its two lanes: `gate, up = unpack(acc)`."""
    if isinstance(value, TorchPair):
        return value.a, value.b
    if is_torch(value):
        raise TypeError(
            "unpack() got an unpaired value: declare mode='acc_pair' (adjacent accumulator "
            "columns) or mode='packed_pair' (16-bit C/D holding (x, y) pairs)"
        )
    from quack.epilogue.math import unpack as quack_unpack

    return quack_unpack(value)


@traced
def pack(a, b):
    """Join two lanes into a paired value: `return {"D": pack(dx, dy)}`."""
    if is_torch(a, b):
        return TorchPair(a, b)
    from quack.epilogue.math import Pair

    return Pair(a, b)
