"""Fused training ops as torch.library custom ops (torch >= 2.4: custom_op, register_fake,
register_autograd).

swiglu_mlp(a, w_gu, w_down) -> (y, z): the LLaMA MLP after its RMSNorm, a the normalised
input (M, d), w_gu the gate/up weight (2F, d) with gate and up rows interleaved (row 2j is
gate unit j, row 2j+1 up unit j: the layout k8 and k7 read), w_down (d, F). y = (silu(gate)
* up) @ w_down^T; z = a @ w_gu^T, the pre-activation saved for the backward.
  forward   k8: one GEMM with SwiGLU in its epilogue (z and the activation), then the down
            projection (a plain GEMM).
  backward  k7: the down projection's dgrad GEMM with the SwiGLU backward in its epilogue
            (dz, and the activation recomputed rather than saved), then the weight
            gradients and the input gradient (plain GEMMs). k7's third output, the ZdZ
            row sums, serves the RMSNorm backward upstream; this op does not need it.
The expert kernels are trusted code (human_kernels/), imported once here; on CPU tensors
they run through the emulator.
"""

from __future__ import annotations

from functools import lru_cache

import torch

K8 = "k8_gemm_swiglu"
K7 = "k7_gemm_partial_swiglu_bwd"


@lru_cache(maxsize=None)
def _kernel(task_name: str):
    from eval.kernel import load_kernel_module
    from eval.machine import expert_kernel

    return load_kernel_module(expert_kernel(task_name))


def _check(a: torch.Tensor, w_gu: torch.Tensor, w_down: torch.Tensor) -> None:
    m, d = a.shape
    two_f, d2 = w_gu.shape
    if d2 != d or two_f % 2 or tuple(w_down.shape) != (d, two_f // 2):
        raise ValueError(f"swiglu_mlp: a {tuple(a.shape)}, w_gu {tuple(w_gu.shape)} and w_down "
                         f"{tuple(w_down.shape)} do not fit (want (M, d), (2F, d), (d, F))")
    if not (a.dtype == w_gu.dtype == w_down.dtype == torch.bfloat16):
        raise ValueError("swiglu_mlp: the expert kernels take bfloat16 operands")


@torch.library.custom_op("epiforge::swiglu_mlp", mutates_args=())
def swiglu_mlp(a: torch.Tensor, w_gu: torch.Tensor, w_down: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check(a, w_gu, w_down)
    out = _kernel(K8).run({"a": a.contiguous(), "w_gu": w_gu.contiguous()}, {})
    return out["out"] @ w_down.T, out["z"]


@swiglu_mlp.register_fake
def _(a, w_gu, w_down):
    return a.new_empty(a.shape[0], w_down.shape[0]), a.new_empty(a.shape[0], w_gu.shape[0])


@torch.library.custom_op("epiforge::swiglu_mlp_backward", mutates_args=())
def swiglu_mlp_backward(dy: torch.Tensor, a: torch.Tensor, w_gu: torch.Tensor, w_down: torch.Tensor,
                        z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out = _kernel(K7).run({"dout": dy.contiguous(), "w_down": w_down.contiguous(), "z": z.contiguous()}, {})
    dz, act = out["dz"], out["out"]
    return dz @ w_gu, dz.T @ a, dy.T @ act  # da, dw_gu, dw_down


@swiglu_mlp_backward.register_fake
def _(dy, a, w_gu, w_down, z):
    return torch.empty_like(a), torch.empty_like(w_gu), torch.empty_like(w_down)


def _setup(ctx, inputs, output):
    a, w_gu, w_down = inputs
    ctx.save_for_backward(a, w_gu, w_down, output[1])


def _backward(ctx, dy, dz_unused):
    a, w_gu, w_down, z = ctx.saved_tensors
    return swiglu_mlp_backward(dy.to(a.dtype), a, w_gu, w_down, z)


swiglu_mlp.register_autograd(_backward, setup_context=_setup)
