"""Tiny finishing steps that fold an epilogue's per-tile partials into final values.

These are the only launches besides the fused GEMM that a task may allow (by name). Each
reads O(M x tiles) floats, a rounding error of the GEMM's traffic. On the CPU they are
plain torch; on the GPU they lower to one small kernel each (primitives/lowering.py).
"""

from __future__ import annotations

import torch

from primitives import trace

#: names a task's `launches` list may use, mapped to what each computes
FINISHERS = {
    "rstd_from_sumsq": "rstd[m] = rsqrt(sum_t partials[m, t] / n + eps)",
    "row_sum": "out[m] = sum_t partials[m, t]",
    "col_sum": "out[n] = sum_t partials[t, n]",
    "cross_entropy": "lse[m] = logsumexp_t partials[m, t]; loss[m] = lse[m] - target_logit[m]",
}


def _check(partials: torch.Tensor, what: str) -> None:
    if not (isinstance(partials, torch.Tensor) and partials.ndim == 2 and partials.dtype == torch.float32):
        raise ValueError(f"{what}: expected a 2-D float32 partials tensor")


def rstd_from_sumsq(partials: torch.Tensor, n: int, eps: float) -> torch.Tensor:
    """RMSNorm's reciprocal rms from per-tile sums of squares: (M, T) -> (M,) float32."""
    trace.record("finish", "rstd_from_sumsq")
    _check(partials, "rstd_from_sumsq")
    if partials.is_cuda:
        from primitives.lowering import finish_on_gpu

        return finish_on_gpu("rstd_from_sumsq", partials, n=n, eps=eps)
    return torch.rsqrt(partials.sum(dim=-1) / n + eps)


def row_sum(partials: torch.Tensor) -> torch.Tensor:
    """Fold RowReduce partials: (M, T) -> (M,) float32."""
    trace.record("finish", "row_sum")
    _check(partials, "row_sum")
    if partials.is_cuda:
        from primitives.lowering import finish_on_gpu

        return finish_on_gpu("row_sum", partials)
    return partials.sum(dim=-1)


def col_sum(partials: torch.Tensor) -> torch.Tensor:
    """Fold ColReduce partials: (T, N) -> (N,) float32."""
    trace.record("finish", "col_sum")
    _check(partials, "col_sum")
    if partials.is_cuda:
        from primitives.lowering import finish_on_gpu

        return finish_on_gpu("col_sum", partials)
    return partials.sum(dim=0)


def cross_entropy(lse_partials: torch.Tensor, target_logit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row loss and log-sum-exp from RowLogSumExp partials and RowSelect's target
    logits: returns (loss, lse), each (M,) float32."""
    trace.record("finish", "cross_entropy")
    _check(lse_partials, "cross_entropy")
    if lse_partials.is_cuda:
        from primitives.lowering import finish_on_gpu

        return finish_on_gpu("cross_entropy", lse_partials, target_logit=target_logit)
    lse = torch.logsumexp(lse_partials, dim=-1)
    return lse - target_logit, lse
