"""Realistic input makers and reference pieces shared by the task references.

Scales follow a trained LLM's: activations ~ N(0, 1), linear weights ~ N(0, 1/K) (so
outputs stay O(1)), norm weights around 1, rstd computed from a real residual stream,
positions 0..seq-1 per sequence, RoPE frequencies theta**(-2j/head_dim), gradients small.

Every reference is `reference(inputs, dims, mm=torch.matmul)` and computes its fused GEMM
as `mm(a, b)`. Task.reference passes `mm` below (the GEMM as a fused kernel computes it);
Task.unfused and bench's torch.compile baseline leave the default, plain `a @ b`, whose
bf16 result is rounded to bf16 as an unfused pipeline's is.
"""

from __future__ import annotations

import math

import torch

ROPE_THETA = 10000.0


def normal(shape, gen, device, std=1.0, dtype=torch.bfloat16) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std).to(dtype)


def linear_weight(n_out: int, n_in: int, gen, device, dtype=torch.bfloat16) -> torch.Tensor:
    """nn.Linear layout (out, in), std 1/sqrt(in)."""
    return normal((n_out, n_in), gen, device, std=1.0 / math.sqrt(n_in), dtype=dtype)


def down_projection_backward_inputs(dims, gen, device, saved: str, width: int, dtype=torch.bfloat16) -> dict:
    """What a backward at an MLP's down projection starts from, drawn in this order: dout
    (M, d), the gradient at the MLP's output (std 1e-2); w_down (d, F), nn.Linear layout; and
    the saved pre-activation `saved` (M, width), standard normal."""
    M, d, F = dims["M"], dims["d"], dims["F"]
    return {"dout": normal((M, d), gen, device, std=1e-2, dtype=dtype),
            "w_down": linear_weight(d, F, gen, device, dtype=dtype),
            saved: normal((M, width), gen, device, dtype=dtype)}


def norm_weight(n: int, gen, device, dtype=torch.bfloat16) -> torch.Tensor:
    return normal((n,), gen, device, std=0.1, dtype=torch.float32).add_(1.0).to(dtype)


def rstd_of(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm's reciprocal rms of each row, in float32 (float64 for a float64 x)."""
    xf = at_least_float32(x)
    return torch.rsqrt(xf.pow(2).mean(-1) + eps)


def deferred_rmsnorm_input(m: int, d: int, gen, device, eps: float = 1e-6,
                           dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """What a GEMM after a deferred RMSNorm reads: h = x * norm_weight (in `dtype`) and the
    rows' real rstd (float32), from a residual stream x ~ N(0, 1) (held in `dtype`)."""
    x = normal((m, d), gen, device, dtype=dtype)
    nw = norm_weight(d, gen, device, dtype=dtype)
    return (x.float() * nw.float()).to(dtype), rstd_of(x, eps)


def positions(m: int, seq: int, device) -> torch.Tensor:
    """0..seq-1 for each sequence of the batch, float32 (exact to 2**24)."""
    return (torch.arange(m, device=device) % seq).to(torch.float32)


def rope_inv_freq(head_dim: int, device) -> torch.Tensor:
    j = torch.arange(0, head_dim, 2, device=device, dtype=torch.float64)
    return (1.0 / ROPE_THETA ** (j / head_dim)).to(torch.float32)


def targets(m: int, vocab: int, gen, device) -> torch.Tensor:
    return torch.randint(0, vocab, (m,), generator=gen, device=device, dtype=torch.int64)


# ---- reference pieces (plain torch; they run in whatever dtype they are given) ---------


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The fused GEMM a @ b as an honest kernel computes it: the products of the operands
    as given, accumulated in float32, the result float32 and not rounded (on CUDA a
    tensor-core GEMM, as CODA v0.1's references do with torch.mm(..., out_dtype=float32)).
    Float64 operands stay float64 (the exact reference)."""
    if a.dtype == torch.float64:
        return a @ b.to(torch.float64)
    if a.is_cuda and a.dtype in (torch.bfloat16, torch.float16) and b.dtype == a.dtype:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()  # the CPU has no mm with out_dtype; bf16 and fp16 products are exact in float32


def stored_as(dtype: torch.dtype):
    """The `store` a task of several GEMMs hands its reference in the low-precision run: a
    tensor a fused pipeline writes to memory between its kernels (an activation, a gradient)
    is rounded once to `dtype` and read back, in the working precision (float32), the value
    the next kernel reads. The exact reference stores nothing (`keep`); the plain PyTorch
    pipeline holds each in the inputs' dtype (`held_in`)."""

    def store(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).to(t.dtype) if t.is_floating_point() and t.dtype.itemsize > dtype.itemsize else t

    return store


def keep(t: torch.Tensor) -> torch.Tensor:
    """`store` of the exact reference: the value as computed."""
    return t


def held_in(dtype: torch.dtype):
    """`store` of the plain PyTorch pipeline (Task.unfused, the eager and torch.compile
    baselines): each stored tensor held in `dtype`, the inputs' precision, as a plain model
    holds its activations, so that the next GEMM runs in it too."""
    return lambda t: t.to(dtype) if t.is_floating_point() else t


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """t in float32, or float64 if it is (a reduction as plain PyTorch code writes it: HF's
    RMSNorm upcasts before it squares; the exact reference stays float64)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def swiglu_interleaved(z: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for z = [g0, u0, g1, u1, ...] along the last axis."""
    g, u = z[..., 0::2], z[..., 1::2]
    return torch.nn.functional.silu(g) * u


def rope_interleaved(z: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, rotary_cols: int,
                     direction: float = 1.0) -> torch.Tensor:
    """Rotate the first `rotary_cols` columns of z (whole heads) in adjacent pairs
    (2j, 2j+1) of each head by direction * pos[m] * inv_freq[j]; the rest pass through.
    direction +1: (x, y) -> (x cos - y sin, x sin + y cos), Hugging Face LLaMA's rotation;
    -1: (x cos + y sin, -x sin + y cos), CODA v0.1's (kernels/refs/gpt.py)."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction!r}")
    m = z.shape[0]
    head_dim = 2 * inv_freq.shape[0]
    angle = direction * (pos[:, None] * inv_freq[None, :])  # (M, head_dim/2)
    cos, sin = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]
    rot = z[:, :rotary_cols].reshape(m, rotary_cols // head_dim, head_dim // 2, 2)
    x1, x2 = rot[..., 0], rot[..., 1]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).reshape(m, rotary_cols)
    return torch.cat((rotated, z[:, rotary_cols:]), dim=1)


def cross_entropy_rows(logits: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, lse) per row."""
    lse = torch.logsumexp(logits, dim=-1)
    return lse - logits.gather(1, tgt[:, None])[:, 0], lse
