"""Finishing steps: small launches beside the fused GEMMs, most of them folding an
epilogue's per-tile partials into final values.

They are the only launches besides the fused GEMMs that a task may allow (by name, in its
`launches` list). A fold reads O(M x tiles) floats, a rounding error of the GEMM's traffic.
One built-in step is not a fold: rope_backward, RoPE's backward on an incoming gradient
(a whole M x N pass), which a task of several GEMMs needs before the QKV projection's
backward GEMMs (no epilogue can do it: it acts on a GEMM's A operand).
The steps form an open registry: a step is a name, what it computes, its torch function
(the CPU, the emulator's world) and its GPU lowering (one kernel on CUDA tensors, whose
name the GPU's launch check expects, eval/launches.py). The four below are built in; a task
adds its own in an optional `finishing.py` beside its reference.py (tasks/AUTHORING.md),
with `register`. A kernel calls a step as `P.finish.<name>(...)`; the call is recorded
(primitives/trace.py), so the CPU evaluation checks the task's list as the GPU does.
"""

from __future__ import annotations

import functools
import keyword
from dataclasses import dataclass
from typing import Any, Callable

import torch

from epiforge.primitives import program, trace


@dataclass(frozen=True)
class FinishingStep:
    """One registered step: `cpu(first, *args)` on CPU tensors, `gpu(first, *args)` on
    CUDA tensors launching exactly one kernel named `gpu_kernel`. `first` is the kind of
    its first argument: "partials" (a 2-D float32 tensor of per-tile partials, a fold) or
    "tensor" (a 2-D row-major tensor of any floating dtype)."""

    name: str
    meaning: str
    cpu: Callable[..., Any]
    gpu: Callable[..., Any]
    gpu_kernel: str
    first: str = "partials"


#: every registered step by name
STEPS: dict[str, FinishingStep] = {}
#: name -> what it computes, for the docs, task specs and the agent's pack (kept in step with STEPS)
FINISHERS: dict[str, str] = {}


def register(name: str, meaning: str, *, cpu: Callable[..., Any], gpu: Callable[..., Any],
             gpu_kernel: str, first: str = "partials") -> Callable[..., Any]:
    """Add a finishing step; returns the function kernels call (also `P.finish.<name>`).
    Registering the same name again with the same functions is a no-op (a module imported
    twice); another step under a taken name is a ValueError."""
    if not (name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")):
        raise ValueError(f"a finishing step's name must be a plain identifier, got {name!r}")
    if not (callable(cpu) and callable(gpu) and isinstance(gpu_kernel, str) and gpu_kernel):
        raise ValueError(f"finishing step {name!r}: cpu and gpu must be functions and gpu_kernel a kernel name")
    if first not in ("partials", "tensor"):
        raise ValueError(f"finishing step {name!r}: first must be 'partials' or 'tensor', got {first!r}")
    step = FinishingStep(name, meaning, cpu, gpu, gpu_kernel, first)
    old = STEPS.get(name)
    if old is not None and (old.cpu.__qualname__, old.gpu.__qualname__, old.gpu_kernel) != (
            cpu.__qualname__, gpu.__qualname__, gpu_kernel):
        raise ValueError(f"a finishing step named {name!r} is already registered")
    if old is None and name in globals():
        raise ValueError(f"{name!r} is taken by primitives.finish itself")
    STEPS[name], FINISHERS[name] = step, meaning
    return lambda partials, *args, **kw: _run(name, partials, *args, **kw)


def _run(name: str, partials, *args, **kw):
    """A finishing step's call: one recorded step while a kernel is described."""
    return program.primitive_call("finish", name, functools.partial(_run_step, name), (partials, *args), kw)


def _run_step(name: str, partials, *args, **kw):
    step = STEPS[name]
    trace.record("finish", name)
    if step.first == "partials" and not (isinstance(partials, torch.Tensor) and partials.ndim == 2
                                         and partials.dtype == torch.float32):
        raise ValueError(f"{name}: expected a 2-D float32 partials tensor")
    if step.first == "partials" and not trace.is_partials(partials):
        # a fold folds what a fused launch's reduction wrote, as wide as its tile grid: given any
        # other tensor (full-width logits, a slice, a copy) it would do the task's work itself
        raise ValueError(f"{name}: its partials must be a reduction's output of a fused GEMM of this run, as "
                         "returned (not a tensor made otherwise, a slice or a copy)")
    if step.first == "tensor" and not (isinstance(partials, torch.Tensor) and partials.ndim == 2
                                       and partials.is_floating_point() and partials.stride(-1) == 1):
        raise ValueError(f"{name}: expected a 2-D floating tensor with contiguous rows")
    # described (primitives/program.py), a GPU's values are fake: the CPU form makes their shapes
    return (step.gpu if partials.is_cuda and not program.describing() else step.cpu)(partials, *args, **kw)


def __getattr__(name: str):
    """P.finish.<name> for the steps a task registered."""
    if name in STEPS:
        return lambda partials, *args, **kw: _run(name, partials, *args, **kw)
    raise AttributeError(f"primitives.finish has no finishing step {name!r}; registered: {sorted(STEPS)}")


# ---- the built-in steps ------------------------------------------------------------------
# GPU: one Triton kernel each (primitives/finish_gpu.py), imported on first use


def _gpu(fn_name: str) -> Callable[..., Any]:
    def call(*args, **kw):
        from epiforge.primitives import finish_gpu

        return getattr(finish_gpu, fn_name)(*args, **kw)

    call.__qualname__ = f"finish_gpu.{fn_name}"
    return call


def _rstd_cpu(partials, n, eps):
    return torch.rsqrt(partials.sum(dim=-1) / n + eps)


def _row_sum_cpu(partials):
    return partials.sum(dim=-1)


def _col_sum_cpu(partials):
    return partials.sum(dim=0)


def _cross_entropy_cpu(partials, target_logit):
    lse = torch.logsumexp(partials, dim=-1)
    return lse - target_logit, lse


def _rope_backward_cpu(dqkv, qkv, positions, inv_freq, rotary_cols, direction):
    m = dqkv.shape[0]
    half = inv_freq.shape[0]
    g = dqkv.float()
    angle = (positions.float()[:, None] * inv_freq.float()[None, :]) * float(-direction)  # the inverse rotation
    cos, sin = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]
    pairs = g[:, :rotary_cols].reshape(m, rotary_cols // (2 * half), half, 2)
    x, y = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x * cos - y * sin, x * sin + y * cos), dim=-1).reshape(m, rotary_cols)
    dz = torch.cat((rotated, g[:, rotary_cols:]), dim=1).to(dqkv.dtype)
    return dz, (qkv.float() * g).sum(dim=-1)


_rstd = register("rstd_from_sumsq", "rstd[m] = rsqrt(sum_t partials[m, t] / n + eps)",
                 cpu=_rstd_cpu, gpu=_gpu("rstd_from_sumsq"), gpu_kernel="_row_fold")
_row_sum = register("row_sum", "out[m] = sum_t partials[m, t]", cpu=_row_sum_cpu, gpu=_gpu("row_sum"),
                    gpu_kernel="_row_fold")
_col_sum = register("col_sum", "out[n] = sum_t partials[t, n]", cpu=_col_sum_cpu, gpu=_gpu("col_sum"),
                    gpu_kernel="_col_fold")
_cross_entropy = register("cross_entropy",
                          "lse[m] = logsumexp_t partials[m, t]; loss[m] = lse[m] - target_logit[m]",
                          cpu=_cross_entropy_cpu, gpu=_gpu("cross_entropy"), gpu_kernel="_row_fold")

_rope_backward = register(
    "rope_backward",
    "RoPE's backward and the ZdZ of the norm before it, from the gradient at the rotated projection: "
    "dz = dqkv with its first rotary_cols columns' adjacent pairs (2j, 2j+1) of each head rotated back by "
    "-direction * positions[m] * inv_freq[j] (the rest as they are), in dqkv's dtype; zdz[m] = sum_n qkv[m, n] * "
    "dqkv[m, n] in float32 (the rotation is orthogonal, so it is the sum over the projection before RoPE)",
    cpu=_rope_backward_cpu, gpu=_gpu("rope_backward"), gpu_kernel="_rope_bwd", first="tensor")


#: the steps primitives itself provides (the docs' table; a task's own come on top)
BUILTIN_STEPS = frozenset(STEPS)


def rstd_from_sumsq(partials: torch.Tensor, n: int, eps: float) -> torch.Tensor:
    """RMSNorm's reciprocal rms from per-tile sums of squares: (M, T) -> (M,) float32."""
    return _rstd(partials, n, eps)


def row_sum(partials: torch.Tensor) -> torch.Tensor:
    """Fold RowReduce partials: (M, T) -> (M,) float32."""
    return _row_sum(partials)


def col_sum(partials: torch.Tensor) -> torch.Tensor:
    """Fold ColReduce partials: (T, N) -> (N,) float32."""
    return _col_sum(partials)


def rope_backward(dqkv: torch.Tensor, qkv: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                  rotary_cols: int, direction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's backward at the projection before it, and that projection's ZdZ: (M, N) dqkv
    (the gradient at the rotated output) and qkv (the rotated output itself, as stored) ->
    (dz: (M, N), dqkv's dtype, the first rotary_cols columns rotated back, pairs (2j, 2j+1)
    adjacent within each head of 2 * len(inv_freq) columns; zdz: (M,) float32, sum_n qkv *
    dqkv). `direction` is the forward rotation's sign (+1 Hugging Face, -1 CODA v0.1)."""
    head = 2 * inv_freq.shape[0] if isinstance(inv_freq, torch.Tensor) and inv_freq.ndim == 1 else 0
    tensors = (dqkv, qkv, positions, inv_freq)
    if not (all(isinstance(t, torch.Tensor) for t in tensors) and qkv.shape == dqkv.shape and qkv.stride(-1) == 1
            and dqkv.shape[-1] % 2 == 0 and head and 0 <= rotary_cols <= dqkv.shape[-1] and rotary_cols % head == 0
            and direction in (1, -1) and positions.shape == (dqkv.shape[0],)
            and positions.dtype == inv_freq.dtype == torch.float32 and positions.is_contiguous()
            and inv_freq.is_contiguous() and len({t.device for t in tensors}) == 1):
        raise ValueError("rope_backward: dqkv and qkv must be (M, N) with contiguous rows and N even, positions (M,) "
                         "and inv_freq contiguous float32, all on one device; rotary_cols whole heads of "
                         "2 * len(inv_freq) columns within N, direction +1 or -1")
    return _rope_backward(dqkv, qkv, positions, inv_freq, rotary_cols, direction)


def cross_entropy(lse_partials: torch.Tensor, target_logit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row loss and log-sum-exp from RowLogSumExp partials and RowSelect's target
    logits: returns (loss, lse), each (M,) float32."""
    return _cross_entropy(lse_partials, target_logit)
