"""Liger-Kernel composites (cuBLAS GEMMs + Liger's Triton kernels), timed beside the fused
kernels where Liger has the op: the best separate kernels a user can call today.

Each composite does the task's work in unfused form; Liger's layouts differ from ours in
details that do not change the work (its fused gate/up SwiGLU splits the tensor in halves
where ours interleaves; its add+RMSNorm applies rstd where k0 defers it), noted per entry."""

from __future__ import annotations

import torch


def composites() -> dict:
    """{task name: (fn(inputs) -> outputs, note)}; empty when Liger is not installed."""
    try:
        from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward
        from liger_kernel.ops.fused_linear_cross_entropy import fused_linear_cross_entropy_forward
        from liger_kernel.ops.swiglu import swiglu_fused_gate_up_backward, swiglu_fused_gate_up_forward
    except ImportError:
        return {}

    def k0(s):
        y = s["a"] @ s["w_o"].T
        return fused_add_rms_norm_forward(y, s["residual"], s["norm_weight"], s["eps"], 0.0, "llama")[:3]

    def k8(s):
        return swiglu_fused_gate_up_forward(s["a"] @ s["w_gu"].T)

    def k7(s):
        dc = s["dout"] @ s["w_down"]
        return swiglu_fused_gate_up_backward(s["z"], dc)

    def k9(s):
        with torch.no_grad():
            return fused_linear_cross_entropy_forward(s["a"], s["w_lm"], s["targets"], reduction="none")

    return {
        "k0_gemm_residual_partial_rmsnorm": (k0, "cuBLAS GEMM + Liger fused add+RMSNorm (applies rstd)"),
        "k8_gemm_swiglu": (k8, "cuBLAS GEMM + Liger fused gate/up SiLU-mul (halves layout)"),
        "k7_gemm_partial_swiglu_bwd": (k7, "cuBLAS dgrad GEMM + Liger fused gate/up SiLU-mul backward (no ZdZ)"),
        "k9_gemm_partial_cross_entropy": (k9, "Liger fused linear cross-entropy forward (chunked; computes input gradients too)"),
    }
