"""Liger-Kernel composites (cuBLAS GEMMs + Liger's Triton kernels), timed beside the fused
kernels where Liger has the op: the best separate kernels a user can call today.

Each composite does the task's work in the unfused form a Liger user runs; where Liger's
layout or convention differs from ours in a way that does not change the work (its fused
gate/up SwiGLU splits the tensor in halves where ours interleaves; its add+RMSNorm applies
rstd where k0 defers it; its RoPE rotates half-split heads), the note says so. Constants a
model computes once per step (RoPE cos/sin, a ones weight) are made once, outside timing."""

from __future__ import annotations

import torch

from epiforge.eval.memo import once



def composites() -> dict:
    """{task name: (fn(inputs, dims) -> outputs, note)}; empty when Liger is not installed."""
    try:
        from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_backward, fused_add_rms_norm_forward
        from liger_kernel.ops.fused_linear_cross_entropy import fused_linear_cross_entropy_forward
        from liger_kernel.ops.rms_norm import rms_norm_forward
        from liger_kernel.ops.rope import rope_forward
        from liger_kernel.ops.swiglu import swiglu_fused_gate_up_backward, swiglu_fused_gate_up_forward
        from liger_kernel.ops.utils import calculate_settings
    except ImportError:
        return {}

    def rmsnorm(x, eps=1e-6):
        """Liger RMSNorm forward of the layer input (a ones weight: h already carries it)."""
        ones = once(("ones", x.shape[1]), lambda: torch.ones(x.shape[1], dtype=x.dtype, device=x.device))
        return rms_norm_forward(x, ones, eps, 0.0, "llama", False)[0]

    def rope(qkv_w, a, positions, inv_freq, seq):
        """HF attention: q, k, v projections (cuBLAS), then Liger RoPE on q and k in place."""
        d = qkv_w.shape[1]
        hd = 2 * inv_freq.shape[0]
        q, k, v = (a @ qkv_w[i * d:(i + 1) * d].T for i in range(3))
        b = a.shape[0] // seq

        def cos_sin():
            angle = positions[:seq, None] * inv_freq[None, :]
            emb = torch.cat((angle, angle), dim=-1)
            return emb.cos().to(a.dtype), emb.sin().to(a.dtype)

        cos, sin = once(("rope", positions, inv_freq), cos_sin)
        heads = lambda t: t.view(b, seq, d // hd, hd).transpose(1, 2)  # noqa: E731
        q, k, _, _ = rope_forward(heads(q), heads(k), cos, sin)
        return q, k, v

    def k0(s, dims):
        y = s["a"] @ s["w_o"].T
        return fused_add_rms_norm_forward(y, s["residual"], s["norm_weight"], s["eps"], 0.0, "llama")[:3]

    def k1(s, dims):
        return rmsnorm(s["h"]) @ s["w"].T

    def k2(s, dims):
        z = rmsnorm(s["h"]) @ s["w_gu"].T
        return z, swiglu_fused_gate_up_forward(z)

    def k3(s, dims):
        return rope(s["w_qkv"], s["a"], s["positions"], s["inv_freq"], dims["seq"])

    def k4(s, dims):
        return rope(s["w_qkv"], rmsnorm(s["h"]), s["positions"], s["inv_freq"], dims["seq"])

    def k5(s, dims):
        with torch.no_grad():
            return fused_linear_cross_entropy_forward(rmsnorm(s["h"]), s["w_lm"], s["targets"], reduction="none")

    def k6(s, dims):
        g = s["dz"] @ s["w_gu"]
        block, warps = calculate_settings(g.shape[1])
        return fused_add_rms_norm_backward(g, s["dx_in"], s["x"], s["norm_weight"], s["rstd"], 0.0, "llama",
                                           block, warps, 2, False)

    def k7(s, dims):
        dc = s["dout"] @ s["w_down"]
        return swiglu_fused_gate_up_backward(s["z"], dc)

    def k8(s, dims):
        return swiglu_fused_gate_up_forward(s["a"] @ s["w_gu"].T)

    def k9(s, dims):
        with torch.no_grad():
            return fused_linear_cross_entropy_forward(s["a"], s["w_lm"], s["targets"], reduction="none")

    rmsnorm_note = "Liger RMSNorm forward of the layer input (recomputes and applies rstd)"
    rope_note = "cuBLAS q, k, v projections (HF layout) + Liger RoPE in place (half-split heads)"
    return {
        "k0_gemm_residual_partial_rmsnorm": (k0, "cuBLAS GEMM + Liger fused add+RMSNorm (applies rstd)"),
        "k1_gemm_rmsnorm": (k1, f"{rmsnorm_note} + cuBLAS GEMM"),
        "k2_gemm_rmsnorm_swiglu": (k2, f"{rmsnorm_note} + cuBLAS GEMM + Liger fused gate/up SiLU-mul (halves layout)"),
        "k3_gemm_rope": (k3, rope_note),
        "k4_gemm_rmsnorm_rope": (k4, f"{rmsnorm_note} + {rope_note}"),
        "k5_gemm_rmsnorm_partial_cross_entropy": (
            k5, f"{rmsnorm_note} + Liger fused linear cross-entropy forward (chunked; no gradients)"),
        "k6_gemm_residual_partial_rmsnorm_bwd": (
            k6, "cuBLAS dgrad GEMM + Liger fused add+RMSNorm backward (dx with the residual gradient, dw; "
                "no h, no deferred correction: it reduces each row itself)"),
        "k7_gemm_partial_swiglu_bwd": (k7, "cuBLAS dgrad GEMM + Liger fused gate/up SiLU-mul backward (no ZdZ)"),
        "k8_gemm_swiglu": (k8, "cuBLAS GEMM + Liger fused gate/up SiLU-mul (halves layout)"),
        "k9_gemm_partial_cross_entropy": (k9, "Liger fused linear cross-entropy forward (chunked; no gradients)"),
    }
