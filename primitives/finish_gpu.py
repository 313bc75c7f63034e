"""The built-in finishing steps on CUDA tensors (primitives/finish.py registers them): one
small Triton kernel each, so that a task's launch budget ("gemm" plus named finishers)
counts them as one launch apiece.
(Triton's interpreter runs these on CPU tensors for the tests: TRITON_INTERPRET=1.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_fold(P, OUT, OUT2, T_IDX, M, T, n, eps, stride_m, KIND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_T)
    mask = (rows[:, None] < M) & (cols[None, :] < T)
    if KIND == 2:  # cross-entropy: stable logsumexp over the tiles' partial LSEs
        x = tl.load(P + rows[:, None] * stride_m + cols[None, :], mask=mask, other=-float("inf"))
        mx = tl.max(x, axis=1)
        safe = tl.where(mx == -float("inf"), 0.0, mx)
        lse = safe + tl.log(tl.sum(tl.exp(x - safe[:, None]), axis=1))
        tgt = tl.load(T_IDX + rows, mask=rows < M, other=0.0)
        tl.store(OUT + rows, lse - tgt, mask=rows < M)
        tl.store(OUT2 + rows, lse, mask=rows < M)
    else:
        x = tl.load(P + rows[:, None] * stride_m + cols[None, :], mask=mask, other=0.0)
        s = tl.sum(x, axis=1)
        if KIND == 1:  # rstd from sums of squares
            s = 1.0 / tl.sqrt(s / n + eps)
        tl.store(OUT + rows, s, mask=rows < M)


@triton.jit
def _col_fold(P, OUT, T, N, stride_t, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for t in range(0, T):
        acc += tl.load(P + t * stride_t + cols, mask=cols < N, other=0.0)
    tl.store(OUT + cols, acc, mask=cols < N)


def _rows(kind: int, partials: torch.Tensor, n: float = 1.0, eps: float = 0.0, target_logit=None):
    partials = partials.contiguous()
    m, t = partials.shape
    out = torch.empty(m, dtype=torch.float32, device=partials.device)
    out2 = torch.empty_like(out) if kind == 2 else out
    tgt = target_logit.contiguous() if target_logit is not None else out
    block_t = triton.next_power_of_2(max(t, 1))
    block_m = max(1, min(128, 8192 // block_t))
    _row_fold[(triton.cdiv(m, block_m),)](partials, out, out2, tgt, m, t, float(n), float(eps), partials.stride(0),
                                          KIND=kind, BLOCK_M=block_m, BLOCK_T=block_t)
    return (out, out2) if kind == 2 else out


def row_sum(partials: torch.Tensor) -> torch.Tensor:
    return _rows(0, partials)


def rstd_from_sumsq(partials: torch.Tensor, n: int, eps: float) -> torch.Tensor:
    return _rows(1, partials, n=n, eps=eps)


def cross_entropy(partials: torch.Tensor, target_logit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _rows(2, partials, target_logit=target_logit.float())


def col_sum(partials: torch.Tensor) -> torch.Tensor:
    partials = partials.contiguous()
    t, n = partials.shape
    out = torch.empty(n, dtype=torch.float32, device=partials.device)
    _col_fold[(triton.cdiv(n, 256),)](partials, out, t, n, partials.stride(0), BLOCK_N=256)
    return out


@triton.jit
def _rope_bwd(G, Q, POS, INV, DZ, ZDZ, N, R, HALF, stride_g, stride_q, stride_dz, sign, BLOCK: tl.constexpr):
    """One row: its column pairs rotated back (the first R columns), ZdZ summed over all."""
    row = tl.program_id(0).to(tl.int64)
    pos = tl.load(POS + row)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, N // 2, BLOCK):
        p = start + tl.arange(0, BLOCK)
        c0 = 2 * p
        mask = p < N // 2
        x = tl.load(G + row * stride_g + c0, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(G + row * stride_g + c0 + 1, mask=mask, other=0.0).to(tl.float32)
        f = tl.load(INV + p % HALF, mask=mask, other=0.0)
        angle = (pos * f) * sign
        # tl.cos / tl.sin are the precise libdevice functions on NVIDIA GPUs (the fast ones are
        # opt-in, libdevice.fast_cosf: intel/intel-xpu-backend-for-triton#7063 compares them),
        # so large angles (positions * inv_freq reach thousands) keep their accuracy
        cos = tl.cos(angle)
        sin = tl.sin(angle)
        rot = c0 < R
        out_x = tl.where(rot, x * cos - y * sin, x)
        out_y = tl.where(rot, x * sin + y * cos, y)
        tl.store(DZ + row * stride_dz + c0, out_x.to(DZ.dtype.element_ty), mask=mask)
        tl.store(DZ + row * stride_dz + c0 + 1, out_y.to(DZ.dtype.element_ty), mask=mask)
        qx = tl.load(Q + row * stride_q + c0, mask=mask, other=0.0).to(tl.float32)
        qy = tl.load(Q + row * stride_q + c0 + 1, mask=mask, other=0.0).to(tl.float32)
        acc += qx * x + qy * y
    tl.store(ZDZ + row, tl.sum(acc, axis=0))


def rope_backward(dqkv: torch.Tensor, qkv: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                  rotary_cols: int, direction: float) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = dqkv.shape
    dz = torch.empty_like(dqkv, memory_format=torch.contiguous_format)
    zdz = torch.empty(m, dtype=torch.float32, device=dqkv.device)
    _rope_bwd[(m,)](dqkv, qkv, positions, inv_freq, dz, zdz, n, rotary_cols, inv_freq.shape[0], dqkv.stride(0),
                    qkv.stride(0), dz.stride(0), float(-direction), BLOCK=512)
    return dz, zdz
