"""What an epilogue declares besides its function: operand kinds, reductions, pairing mode.

Names follow the OUTPUT tile D (M rows x N columns), never a vector's orientation:
`PerRow` is one value per output row m (quack calls this a *ColVec*), `PerCol` one value
per output column n (quack's *RowVec*). Every declaration maps 1:1 onto a quack 0.6.5
EpiOp (primitives/lowering.py) and has a torch meaning (primitives/emulator.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

Combine = Literal["sum", "max", "absmax"]
Mode = Literal["element", "acc_pair", "packed_pair"]
MODES: tuple[str, ...] = ("element", "acc_pair", "packed_pair")


# ---- operands: values the epilogue function reads besides the accumulator ----------


@dataclass(frozen=True)
class PerRow:
    """One value per output row m: a (M,) tensor, e.g. RMSNorm's rstd or a row's position."""


@dataclass(frozen=True)
class PerCol:
    """One value per output column n: a (N,) tensor, e.g. the RMSNorm weight or a bias."""


@dataclass(frozen=True)
class Scalar:
    """One value for the whole GEMM: a Python float or a 1-element tensor (e.g. 1/d)."""


@dataclass(frozen=True)
class Tile:
    """A full (M, N) tensor read tile by tile, e.g. a saved activation.
    The GEMM's own C operand is always the parameter named `c` and needs no declaration."""


@dataclass(frozen=True)
class HeadRMS:
    """One value per (row, head): the reciprocal RMS of the accumulator over the head's
    `head_dim` columns, rsqrt(mean(acc**2) + eps), computed inside the kernel (a prepass
    over the tile, quack's HeadRstd), so there is no input to pass. Multiply by it (and by
    a PerCol weight) for a per-head RMSNorm such as Qwen3's QK-norm. N and the tile's N
    must be whole heads."""

    head_dim: int
    eps: float = 1e-6

    def __post_init__(self):
        if not (isinstance(self.head_dim, int) and self.head_dim > 0 and self.head_dim % 8 == 0):
            raise ValueError(f"HeadRMS: head_dim must be a positive multiple of 8, got {self.head_dim!r}")
        if not (isinstance(self.eps, (int, float)) and self.eps >= 0):
            raise ValueError(f"HeadRMS: eps must be a number >= 0, got {self.eps!r}")


Operand = Union[PerRow, PerCol, Scalar, Tile, HeadRMS]


# ---- reductions: values the function returns that are folded, not stored -----------


@dataclass(frozen=True)
class RowReduce:
    """Fold the returned value along each output row, one partial per (row, N-tile).
    Result: a float32 (M, ceil(N / tile_n)) tensor; a tiny finishing step folds the tiles.
    `product=True`: the function returns two factors `(a, b)` and the fold adds a*b in
    one fused multiply-add (sum of squares: return `(y, y)`)."""

    combine: Combine = "sum"
    product: bool = False

    def __post_init__(self):
        _check_combine(self.combine, self.product)


@dataclass(frozen=True)
class ColReduce:
    """Fold the returned value down each output column, one partial per (M-tile, column).
    Result: a float32 (ceil(M / tile_m), N) tensor (e.g. a norm weight's gradient)."""

    combine: Combine = "sum"
    product: bool = False

    def __post_init__(self):
        _check_combine(self.combine, self.product)


@dataclass(frozen=True)
class RowLogSumExp:
    """Numerically stable log-sum-exp of the returned value along each row, one partial per
    (row, N-tile): a float32 (M, ceil(N / tile_n)) tensor; logsumexp over its last axis
    finishes it. The online (running max, running sum) form never overflows."""


@dataclass(frozen=True)
class RowSelect:
    """The returned value at column `index[m]` of each row m (cross-entropy's target
    logit): a float32 (M,) tensor. `index` names an int32/int64 (M,) tensor passed as a
    keyword argument of the call; the function itself does not take it. Rows whose index
    is outside [0, N) are not written."""

    index: str


Reduction = Union[RowReduce, ColReduce, RowLogSumExp, RowSelect]


def _check_combine(combine: str, product: bool) -> None:
    if combine not in ("sum", "max", "absmax"):
        raise ValueError(f"combine must be 'sum', 'max' or 'absmax', got {combine!r}")
    if product and combine != "sum":
        raise ValueError("product=True folds a*b with a fused multiply-add: only combine='sum'")


def partials_shape(red: Reduction, m: int, n: int, tile_m: int, tile_n: int) -> tuple[int, ...]:
    """The shape of the float32 buffer a reduction writes for an (m, n) output tile grid."""
    if isinstance(red, (RowReduce, RowLogSumExp)):
        return (m, -(-n // tile_n))
    if isinstance(red, ColReduce):
        return (-(-m // tile_m), n)
    if isinstance(red, RowSelect):
        return (m,)
    raise TypeError(f"not a reduction: {red!r}")
