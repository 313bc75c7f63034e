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

from epiforge.primitives.config import GemmConfig
from epiforge.primitives.epilogue import Call, Epilogue, EpilogueError
from epiforge.primitives.spec import (
    ColReduce,
    HeadRMS,
    PerCol,
    PerRow,
    RowLogSumExp,
    RowReduce,
    RowSelect,
    Scalar,
    Tile,
    partials_shape,
)
from epiforge.primitives.values import TorchPair

# bound the float32 working set of one stripe (~256 MiB of accumulator)
_STRIPE_ELEMENTS = 64 * 1024 * 1024


def emulate(epi: Epilogue, call: Call, config: GemmConfig) -> dict[str, torch.Tensor]:
    m, n = call.m, call.n
    paired = epi.mode == "acc_pair"
    packed = epi.mode == "packed_pair"
    out_width = n // 2 if paired else n
    result: dict[str, torch.Tensor] = {}
    device = call.a.device  # the CPU's, or the judge's (fake values) while a kernel is described (primitives/program.py)
    if call.store_d:
        result["D"] = torch.empty((m, 2 * n if packed else n), dtype=call.dtypes["D"], device=device)
    for o in epi.outputs:
        result[o] = torch.empty((m, out_width), dtype=call.dtypes[o], device=device)
    for o in epi.pair_outputs:
        result[o] = torch.empty((m, n), dtype=call.dtypes[o], device=device)
    for r_name, red in epi.reductions.items():
        shape = partials_shape(red, m, n, config.tile_m, config.tile_n)
        # NaN marks anything the kernel would leave unwritten (a select's out-of-range rows)
        result[r_name] = torch.full(shape, math.nan, dtype=torch.float32, device=device)

    # Ragged last tiles, as on the GPU: the function also runs where a tile overhangs the
    # output, with zeros for the accumulator and every out-of-range operand element; sums
    # fold those values (max and log-sum-exp mask them; stores drop them).
    np_ = n + (-n) % config.tile_n if epi.reductions else n
    mp = m + (-m) % config.tile_m if epi.reductions else m
    w32 = torch.nn.functional.pad(call.w.float(), (0, 0, 0, np_ - n))
    rows = max(config.tile_m, (_STRIPE_ELEMENTS // max(np_, 1)) // config.tile_m * config.tile_m)
    for m0 in range(0, mp, rows):
        m1 = min(mp, m0 + rows)
        real = min(m, m1) - m0  # rows of this stripe inside the output
        acc = _pad_rows(call.a[m0 : m0 + real].float(), m1 - m0) @ w32.T
        args = {p: _head_rms(acc, epi.operands[p], paired) if isinstance(epi.operands.get(p), HeadRMS)
                else _operand_view(epi, p, call, m0, m1, real, np_) for p in epi.params}
        # the function gets its own copies: an in-place op in it (x += c) must not reach
        # the accumulator stored as D, nor an input (on the GPU it only rebinds a name)
        body_acc = acc.clone()
        res = epi.torch_fn(_pair(body_acc) if paired else body_acc, **args)
        if not isinstance(res, dict):
            raise EpilogueError(f"{epi.name}: the function must return a dict, got {type(res).__name__}")
        declared = set(epi.outputs) | set(epi.pair_outputs) | set(epi.reductions)
        missing = declared - set(res)
        if missing:
            raise EpilogueError(f"{epi.name}: the function did not return {sorted(missing)}")
        extra = set(res) - declared - {"D"}
        if extra:
            raise EpilogueError(f"{epi.name}: the function returned undeclared names {sorted(extra)}")
        shape = (m1 - m0, np_)
        if call.store_d and real > 0:
            d = _d_value(epi, res, acc, shape, packed)
            result["D"][m0 : m0 + real] = d[:real, : d.shape[1] * n // np_].to(call.dtypes["D"])
        for o in epi.outputs:
            val = _full(res[o], (m1 - m0, np_ // 2 if paired else np_), f"{epi.name}: output {o!r}")
            if real > 0:
                result[o][m0 : m0 + real] = val[:real, :out_width].to(call.dtypes[o])
        for o in epi.pair_outputs:
            if real > 0:
                val = _pair_tile(res[o], shape, f"{epi.name}: pair output {o!r}")
                result[o][m0 : m0 + real] = val[:real, :n].to(call.dtypes[o])
        for r_name, red in epi.reductions.items():
            val = _reduction_value(epi, r_name, red, res[r_name], shape, paired)
            _fold(red, val, result[r_name], m0, real, n, config, call.values)
    return result


def _head_rms(acc: torch.Tensor, kind: HeadRMS, paired: bool) -> torch.Tensor:
    """HeadRMS's value: rsqrt(mean over each head's columns of acc**2 + eps), one per
    (row, head), broadcast over the head's columns (its pairs in acc_pair mode). Out-of-range
    columns of a ragged tile cannot occur: N is whole heads."""
    rows, cols = acc.shape
    heads = acc[:, : cols - cols % kind.head_dim].reshape(rows, -1, kind.head_dim)
    rstd = torch.rsqrt(heads.pow(2).mean(-1) + kind.eps)  # (rows, heads)
    per_col = rstd.repeat_interleave(kind.head_dim // 2 if paired else kind.head_dim, dim=1)
    width = cols // 2 if paired else cols
    return torch.nn.functional.pad(per_col, (0, width - per_col.shape[1]))


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, 0, 0, rows - t.shape[0])) if t.shape[0] < rows else t


def _pad_cols(t: torch.Tensor, cols: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, cols - t.shape[-1])) if t.shape[-1] < cols else t


def _copy32(t: torch.Tensor) -> torch.Tensor:
    """A float32 copy (never a view of the caller's tensor, whatever its dtype)."""
    return t.to(torch.float32, copy=True)


def _pair(t: torch.Tensor) -> TorchPair:
    return TorchPair(t[:, 0::2], t[:, 1::2])


def _interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack((a, b), dim=-1).flatten(-2)


def _operand_view(epi: Epilogue, p: str, call: Call, m0: int, m1: int, real: int, np_: int):
    """What the function receives for parameter p on rows m0:m1 (zeros outside the output),
    in float32."""
    rows = m1 - m0
    if p == "c":
        width = 2 * np_ if epi.mode == "packed_pair" else np_
        c = _pad_cols(_pad_rows(_copy32(call.c[m0 : m0 + real]), rows), width)
        return _pair(c) if epi.mode in ("acc_pair", "packed_pair") else c
    kind, v = epi.operands[p], call.values[p]
    if isinstance(kind, Scalar):
        return float(v) if not isinstance(v, torch.Tensor) else float(v.reshape(()).item())
    if isinstance(kind, PerRow):
        # broadcast along N; in acc_pair mode one value serves both lanes
        return _pad_rows(_copy32(v[m0 : m0 + real])[:, None], rows)
    if isinstance(kind, PerCol):
        col = _pad_cols(_copy32(v)[None, :], np_)
        return _pair(col) if epi.mode == "acc_pair" else col
    if isinstance(kind, Tile):
        t = _pad_cols(_pad_rows(_copy32(v[m0 : m0 + real]), rows), np_)
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
    if packed:
        if "D" not in res:
            raise EpilogueError(f"{epi.name}: packed_pair mode must return 'D' as pack(x, y)")
        x, y = _lanes(res["D"], f"{epi.name}: D")
        return _interleave(_full(x, shape, "D"), _full(y, shape, "D"))
    if "D" not in res:
        return acc
    if epi.mode == "acc_pair":
        return _pair_tile(res["D"], shape, f"{epi.name}: D")
    return _full(res["D"], shape, f"{epi.name}: D")


def _pair_tile(val, shape, what) -> torch.Tensor:
    """An acc_pair value returned as pack(x, y), as the dense (rows, N) tile it stores:
    lane x in the even columns, lane y in the odd ones."""
    x, y = _lanes(val, what)
    half = (shape[0], shape[1] // 2)
    return _interleave(_full(x, half, what), _full(y, half, what))


def _lanes(val, what):
    if not isinstance(val, tuple) or len(val) != 2:
        raise EpilogueError(f"{what}: expected a pair (use pack(x, y))")
    return val


def _reduction_value(epi, r_name, red, val, shape, paired) -> torch.Tensor:
    """The per-element value a reduction folds, as a dense (rows, N) float32 tile."""
    what = f"{epi.name}: reduction {r_name!r}"
    if paired:
        return _pair_tile(val, shape, what)  # acc_pair: the value covers both lanes of the pair
    if getattr(red, "product", False):
        a, b = _lanes(val, what + " (product=True returns two factors)")
        # the GPU folds each product with one fused multiply-add: no rounding of a*b alone
        return _full(a, shape, what).double() * _full(b, shape, what).double()  # summed in float64
    return _full(val, shape, what)


def _fold(red, val: torch.Tensor, buf: torch.Tensor, m0: int, real: int, n: int, config: GemmConfig, values) -> None:
    """Fold a stripe's (padded) values into the partials buffer the way the GPU does."""
    rows, np_ = val.shape
    masked = isinstance(red, RowLogSumExp) or getattr(red, "combine", None) == "max"
    if masked and np_ > n:  # max and LSE mask the overhang; sum and absmax fold it
        val = torch.cat((val[:, :n], val.new_full((rows, np_ - n), -math.inf)), dim=1)
    x = val.abs() if getattr(red, "combine", None) == "absmax" else val
    if isinstance(red, (RowReduce, RowLogSumExp)):
        x = x[:real].reshape(real, np_ // config.tile_n, config.tile_n)
        if isinstance(red, RowLogSumExp):
            part = torch.logsumexp(x, dim=-1)
        elif red.combine == "sum":
            part = x.sum(dim=-1)
        else:
            part = x.amax(dim=-1)
        buf[m0 : m0 + real] = part
    elif isinstance(red, ColReduce):
        if red.combine == "max" and rows > real:
            x = torch.cat((x[:real], x.new_full((rows - real, np_), -math.inf)))
        x = x[:, :n].reshape(rows // config.tile_m, config.tile_m, n)
        part = x.sum(dim=1) if red.combine == "sum" else x.amax(dim=1)
        buf[m0 // config.tile_m : m0 // config.tile_m + part.shape[0]] = part[: buf.shape[0] - m0 // config.tile_m]
    elif isinstance(red, RowSelect):
        idx = values[red.index][m0 : m0 + real].long()
        ok = (idx >= 0) & (idx < n)
        picked = val[:real].gather(1, idx.clamp(0, n - 1)[:, None])[:, 0]
        # rows whose index is out of range keep their NaN (where, not a mask: no shape from values)
        buf[m0 : m0 + real] = torch.where(ok, picked, buf[m0 : m0 + real])
    else:
        raise EpilogueError(f"unknown reduction {red!r}")
