"""FlashInfer composites (cuBLAS GEMMs + FlashInfer's norm / activation / rope kernels),
the CODA paper's third opponent, timed beside the fused kernels where FlashInfer has the op.

FlashInfer's kernels used (flashinfer-python 0.7.2.post1, docs.flashinfer.ai):
norm.rmsnorm(x, w, eps), norm.fused_add_rmsnorm(x, residual, w, eps) (in place: residual
becomes x + residual, x its RMSNorm times w), activation.silu_and_mul(z) (halves layout:
silu(z[:, :F]) * z[:, F:]), rope.apply_rope_pos_ids_inplace(q, k, pos_ids, interleave=True,
rope_theta) (rotates the pairs (2j, 2j+1) by +pos * theta**(-2j/head_dim), cos/sin made in
the kernel).

Each composite does the task's work in the unfused form a FlashInfer user runs; where
FlashInfer's convention differs in a way that does not change the work, the note says so
(its add+RMSNorm applies rstd where k0 defers it; its SwiGLU splits halves where ours
interleaves; its RoPE rotates by +angle, where k3 and k4 rotate by -angle). Per-input-set
constants (a ones weight, integer positions, theta, k0's scratch residual) are made once,
outside timing. FlashInfer has no cross-entropy and no backward kernels: k5, k6, k7 and k9
have no composite. composites() is empty where FlashInfer does not import (the CPU; on the
H200 it comes through ../shared/gpu/stage-flashinfer)."""

from __future__ import annotations

import torch

from epiforge.eval.memo import once

ROPE_TASKS = ("k3_gemm_rope", "k3hf_gemm_rope", "k4_gemm_rmsnorm_rope", "k4hf_gemm_rmsnorm_rope")


def rope_theta(inv_freq: torch.Tensor) -> float:
    """theta of inv_freq[j] = theta**(-2j/head_dim), the one parameter FlashInfer's RoPE takes."""
    half = inv_freq.shape[0]
    if half < 2:
        raise ValueError("inv_freq needs at least two entries to give theta")
    return float(inv_freq[1].double() ** (-half))


def composites() -> dict:
    """{task name: (fn(inputs, dims) -> outputs, note)}; empty when FlashInfer is not installed."""
    try:
        from flashinfer.activation import silu_and_mul
        from flashinfer.norm import fused_add_rmsnorm, rmsnorm as fi_rmsnorm
        from flashinfer.rope import apply_rope_pos_ids_inplace
    except Exception:  # not installed, or no CUDA toolchain to JIT-build against here
        return {}

    def rmsnorm(x, eps=1e-6):
        """FlashInfer RMSNorm of the layer input (a ones weight: h already carries it)."""
        ones = once(("fi_ones", x.shape[1]), lambda: torch.ones(x.shape[1], dtype=x.dtype, device=x.device))
        return fi_rmsnorm(x, ones, eps)

    def rope(a, w_qkv, positions, inv_freq):
        """One cuBLAS QKV GEMM, then FlashInfer RoPE on its q and k columns in place."""
        m, d = a.shape
        hd = 2 * inv_freq.shape[0]
        qkv = a @ w_qkv.T
        pos = once(("fi_pos", positions), lambda: positions.to(torch.int32))
        theta = once(("fi_theta", inv_freq), lambda: rope_theta(inv_freq))
        q = qkv[:, :d].view(m, d // hd, hd)
        k = qkv[:, d:2 * d].view(m, d // hd, hd)
        apply_rope_pos_ids_inplace(q, k, pos, interleave=True, rope_theta=theta)
        return qkv

    def k0(s, dims):
        y = s["a"] @ s["w_o"].T
        # fused_add_rmsnorm writes its residual argument: a scratch copy made once per input
        # set, so the judge's inputs stay as they are (its values drift; the work does not)
        scratch = once(("fi_residual", s["residual"]), lambda: s["residual"].clone())
        fused_add_rmsnorm(y, scratch, s["norm_weight"], s["eps"])
        return y, scratch

    def k1(s, dims):
        return rmsnorm(s["h"]) @ s["w"].T

    def k2(s, dims):
        z = rmsnorm(s["h"]) @ s["w_gu"].T
        return z, silu_and_mul(z)

    def k3(s, dims):
        return rope(s["a"], s["w_qkv"], s["positions"], s["inv_freq"])

    def k4(s, dims):
        return rope(rmsnorm(s["h"]), s["w_qkv"], s["positions"], s["inv_freq"])

    def k8(s, dims):
        z = s["a"] @ s["w_gu"].T
        return z, silu_and_mul(z)

    norm_note = "FlashInfer RMSNorm of the layer input (recomputes and applies rstd)"
    rope_note = "one cuBLAS QKV GEMM + FlashInfer RoPE of q and k in place (interleaved pairs, +angle)"
    return {
        "k0_gemm_residual_partial_rmsnorm": (k0, "cuBLAS GEMM + FlashInfer fused add+RMSNorm (applies rstd)"),
        "k1_gemm_rmsnorm": (k1, f"{norm_note} + cuBLAS GEMM"),
        "k2_gemm_rmsnorm_swiglu": (k2, f"{norm_note} + cuBLAS GEMM + FlashInfer silu_and_mul (halves layout)"),
        "k3_gemm_rope": (k3, f"{rope_note}; k3 itself rotates by -angle, the same work"),
        "k3hf_gemm_rope": (k3, rope_note),
        "k4_gemm_rmsnorm_rope": (k4, f"{norm_note} + {rope_note}; k4 itself rotates by -angle, the same work"),
        "k4hf_gemm_rmsnorm_rope": (k4, f"{norm_note} + {rope_note}"),
        "k8_gemm_swiglu": (k8, "cuBLAS GEMM + FlashInfer silu_and_mul (halves layout)"),
    }
