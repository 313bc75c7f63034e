"""The CPU meaning of an epilogue: the GEMM in float32, the function on torch tensors,
reductions folded per output tile exactly as the GPU lays its partials out, every stored
output rounded to its dtype once, at the store (as the GPU epilogue does).

The function is elementwise (the GPU calls it per element or per pair), so calling it on
a stripe of whole rows at once computes the same values as calling it tile by tile; the
stripes are multiples of tile_m so per-M-tile partials never straddle two stripes.
"""

from __future__ import annotations

import math

import torch

from primitives.config import GemmConfig
from primitives.epilogue import Call, Epilogue, EpilogueError
from primitives.spec import (
    ColReduce,
    PerCol,
    PerRow,
    RowLogSumExp,
    RowReduce,
    RowSelect,
    Scalar,
    Tile,
    partials_shape,
)
from primitives.values import TorchPair

# bound the float32 working set of one stripe (~256 MiB of accumulator)
_STRIPE_ELEMENTS = 64 * 1024 * 1024


def emulate(epi: Epilogue, call: Call, config: GemmConfig) -> dict[str, torch.Tensor]:
    m, n = call.m, call.n
    paired = epi.mode == "acc_pair"
    packed = epi.mode == "packed_pair"
    d_width = 2 * n if packed else n
    out_width = n // 2 if paired else n
    result: dict[str, torch.Tensor] = {}
    if call.store_d:
        result["D"] = torch.empty((m, d_width), dtype=call.dtypes["D"])
    for o in epi.outputs:
        result[o] = torch.empty((m, out_width), dtype=call.dtypes[o])
    for r_name, red in epi.reductions.items():
        shape = partials_shape(red, m, n, config.tile_m, config.tile_n)
        # NaN marks anything the kernel would leave unwritten (a select's out-of-range rows)
        result[r_name] = torch.full(shape, math.nan, dtype=torch.float32)

    w32 = call.w.float()
    rows = max(config.tile_m, (_STRIPE_ELEMENTS // max(n, 1)) // config.tile_m * config.tile_m)
    for m0 in range(0, m, rows):
        m1 = min(m, m0 + rows)
        acc = call.a[m0:m1].float() @ w32.T
        args = {p: _operand_view(epi, p, call, m0, m1) for p in epi.params}
        res = epi.torch_fn(_pair(acc) if paired else acc, **args)
        if not isinstance(res, dict):
            raise EpilogueError(f"{epi.name}: the function must return a dict, got {type(res).__name__}")
        missing = (set(epi.outputs) | set(epi.reductions)) - set(res)
        if missing:
            raise EpilogueError(f"{epi.name}: the function did not return {sorted(missing)}")
        extra = set(res) - set(epi.outputs) - set(epi.reductions) - {"D"}
        if extra:
            raise EpilogueError(f"{epi.name}: the function returned undeclared names {sorted(extra)}")
        shape = (m1 - m0, n)
        if call.store_d:
            result["D"][m0:m1] = _d_value(epi, res, acc, shape, packed).to(call.dtypes["D"])
        for o in epi.outputs:
            val = _full(res[o], (m1 - m0, out_width), f"{epi.name}: output {o!r}")
            result[o][m0:m1] = val.to(call.dtypes[o])
        for r_name, red in epi.reductions.items():
            val = _reduction_value(epi, r_name, red, res[r_name], shape, paired)
            _fold(red, val, result[r_name], m0, config, call.values)
    return result


def _pair(t: torch.Tensor) -> TorchPair:
    return TorchPair(t[:, 0::2], t[:, 1::2])


def _interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack((a, b), dim=-1).flatten(-2)


def _operand_view(epi: Epilogue, p: str, call: Call, m0: int, m1: int):
    """What the function receives for parameter p on rows m0:m1, in float32."""
    if p == "c":
        c = call.c[m0:m1].float()
        return _pair(c) if epi.mode in ("acc_pair", "packed_pair") else c
    kind, v = epi.operands[p], call.values[p]
    if isinstance(kind, Scalar):
        return float(v) if not isinstance(v, torch.Tensor) else float(v.reshape(()).item())
    if isinstance(kind, PerRow):
        # broadcast along N; in acc_pair mode one value serves both lanes
        return v[m0:m1].float()[:, None]
    if isinstance(kind, PerCol):
        col = v.float()[None, :]
        return _pair(col) if epi.mode == "acc_pair" else col
    if isinstance(kind, Tile):
        t = v[m0:m1].float()
        return _pair(t) if epi.mode == "acc_pair" else t
    raise EpilogueError(f"{epi.name}: unknown operand kind for {p!r}: {kind!r}")


def _full(val, shape, what) -> torch.Tensor:
    """A returned value as a dense float32 tile (numbers and row/column values broadcast)."""
    if isinstance(val, tuple):
        raise EpilogueError(f"{what}: got a pair where one value per element was expected")
    t = torch.as_tensor(val, dtype=torch.float32)
    try:
        return torch.broadcast_to(t.float(), shape)
    except RuntimeError:
        raise EpilogueError(f"{what}: a value of shape {tuple(t.shape)} does not fit the tile {shape}") from None


def _d_value(epi, res, acc, shape, packed) -> torch.Tensor:
    m_rows, n = shape
    if packed:
        if "D" not in res:
            raise EpilogueError(f"{epi.name}: packed_pair mode must return 'D' as pack(x, y)")
        x, y = _lanes(res["D"], f"{epi.name}: D")
        return _interleave(_full(x, shape, "D"), _full(y, shape, "D"))
    if "D" not in res:
        return acc
    if epi.mode == "acc_pair":
        x, y = _lanes(res["D"], f"{epi.name}: D")
        half = (m_rows, n // 2)
        return _interleave(_full(x, half, "D"), _full(y, half, "D"))
    return _full(res["D"], shape, f"{epi.name}: D")


def _lanes(val, what):
    if not isinstance(val, tuple) or len(val) != 2:
        raise EpilogueError(f"{what}: expected a pair (use pack(x, y))")
    return val


def _reduction_value(epi, r_name, red, val, shape, paired) -> torch.Tensor:
    """The per-element value a reduction folds, as a dense (rows, N) float32 tile."""
    what = f"{epi.name}: reduction {r_name!r}"
    if paired:
        # acc_pair: the value covers both lanes of the pair (full GEMM-N width)
        x, y = _lanes(val, what)
        half = (shape[0], shape[1] // 2)
        return _interleave(_full(x, half, what), _full(y, half, what))
    if getattr(red, "product", False):
        a, b = _lanes(val, what + " (product=True returns two factors)")
        return _full(a, shape, what) * _full(b, shape, what)
    return _full(val, shape, what)


def _fold(red, val: torch.Tensor, buf: torch.Tensor, m0: int, config: GemmConfig, values) -> None:
    rows, n = val.shape
    if isinstance(red, (RowReduce, RowLogSumExp)):
        tn = config.tile_n
        n_tiles = -(-n // tn)
        pad = n_tiles * tn - n
        if isinstance(red, RowLogSumExp) or red.combine == "max":
            fill = -math.inf
        else:
            fill = 0.0
        x = val.abs() if getattr(red, "combine", None) == "absmax" else val
        x = torch.nn.functional.pad(x, (0, pad), value=fill).view(rows, n_tiles, tn)
        if isinstance(red, RowLogSumExp):
            part = torch.logsumexp(x, dim=-1)
        elif red.combine == "sum":
            part = x.sum(dim=-1)
        else:
            part = x.amax(dim=-1)
        buf[m0 : m0 + rows] = part
    elif isinstance(red, ColReduce):
        tm = config.tile_m
        t_tiles = -(-rows // tm)
        pad = t_tiles * tm - rows
        fill = -math.inf if red.combine == "max" else 0.0
        x = val.abs() if red.combine == "absmax" else val
        x = torch.nn.functional.pad(x, (0, 0, 0, pad), value=fill).view(t_tiles, tm, n)
        part = x.sum(dim=1) if red.combine == "sum" else x.amax(dim=1)
        buf[m0 // tm : m0 // tm + t_tiles] = part
    elif isinstance(red, RowSelect):
        idx = values[red.index][m0 : m0 + rows].long()
        ok = (idx >= 0) & (idx < n)
        picked = val.gather(1, idx.clamp(0, n - 1)[:, None])[:, 0]
        seg = buf[m0 : m0 + rows]
        seg[ok] = picked[ok]
    else:
        raise EpilogueError(f"unknown reduction {red!r}")
