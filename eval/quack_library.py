"""quack's own library epilogues (written by CODA's authors) for the tasks whose expert
kernel is ours (k2, k5, k6), timed beside it: the target is to be at least as fast as the
library where it has the op. k0, k3, k4, k7, k8, k9's expert kernels ARE library epilogues.

Each entry: (fn(inputs, config) -> outputs, note, TUNED). The note says how the library's
work differs from the task's where it does; TUNED holds the library epilogue's own best
configs (lab.bench.tuning fills it from a sweep), so it is not timed at a config tuned for ours.
k1 has no entry: no library epilogue applies a row scale alone (norm_act_mod with a colvec
stores its output twice, as D and as the activation output)."""

from __future__ import annotations

import torch

from epiforge import primitives as P
from epiforge.eval.memo import once


# measured best tile configs on the H200 by GEMM m x n x k, written by
# python -m lab.bench.tuning --write from:
#   lab/results/h200/sweep.json lab/results/h200/sweep-cs.json
#   lab/results/h200/sweep-c8.json lab/results/h200/confirm.json
TUNED = {
    "k2_gemm_rmsnorm_swiglu": {
        "16384x11264x2048": "128x128_c2x1_pp",  # 1.007 of GEMM-only
        "16384x22016x4096": "128x128_c2x1_pp",  # 1.005 of GEMM-only
        "16384x44032x8192": "128x192_c2x1_pp_sw1",  # 0.999 of GEMM-only
    },
    "k5_gemm_rmsnorm_partial_cross_entropy": {
        "16384x32768x2048": "192x128_c1x2_pp",  # 1.023 of GEMM-only
        "16384x32768x4096": "128x192_c2x1_pp",  # 1.013 of GEMM-only
        "16384x32768x8192": "192x128_c2x1_pp",  # 1.021 of GEMM-only
    },
    "k6_gemm_residual_partial_rmsnorm_bwd": {
        "16384x2048x11264": "128x128_c1x2_pp_cs1",  # 1.023 of GEMM-only
        "16384x4096x22016": "128x128_c1x2_pp_cs1",  # 1.022 of GEMM-only
        "16384x8192x44032": "128x128_c1x2_pp_cs8",  # 1.019 of GEMM-only
    },
}

norm_swiglu = P.from_quack("quack.epilogue.library:norm_swiglu_mod", operands={"rstd": P.PerRow(), "bias": P.PerCol()})
rstd_lse = P.from_quack("quack.epilogue.library:rstd_lse_epi")
rms_bwd_apply = P.from_quack("quack.epilogue.library:rms_bwd_apply_epi", operands={"y": P.Tile()})


def k2(inputs, config):
    """norm_swiglu_mod: v = acc * rstd + bias (a zero bias here); D = (gate, up), postact."""
    w = inputs["w_gu"]
    bias = once(("bias", w), lambda: w.new_zeros(w.shape[0], dtype=torch.float32))
    out = norm_swiglu(inputs["h"], w, rstd=inputs["rstd"], bias=bias, config=config)
    return {"z": out["D"], "out": out["postact"]}


def k5(inputs, config):
    """rstd_lse_epi: logits = acc * rstd stored, online LSE partials; the target logit is
    gathered from the stored logits and the loss finished from both."""
    out = rstd_lse(inputs["h"], inputs["w_lm"], rstd=inputs["rstd"], config=config)
    target_logit = out["D"].gather(1, inputs["targets"][:, None]).squeeze(1).float()
    loss, lse = P.finish.cross_entropy(out["lse"], target_logit)
    return {"loss": loss, "lse": lse}


def k6(inputs, config):
    """rms_bwd_apply_epi: D = acc * w + C + y * corr, dw partials sum_m acc * y. It is the
    deferred-rstd form of the RMSNorm backward (rstd is not applied to acc), so its dx is not
    the task's; it reads and writes the same tensors except the recomputed h, which it does
    not store (less work than the task)."""
    w_gu = inputs["w_gu"]
    d = w_gu.shape[1]
    rstd, zdz = inputs["rstd"], inputs["zdz"]
    corr = once(("corr", rstd, zdz), lambda: -(rstd * rstd) * zdz / d)
    out = rms_bwd_apply(inputs["dz"], w_gu.T, c=inputs["dx_in"], y=inputs["x"], w=inputs["norm_weight"], corr=corr, config=config)
    return {"dx": out["D"], "dw": P.finish.col_sum(out["dw"])}


NOTES = {
    "k2_gemm_rmsnorm_swiglu": (k2, "quack norm_swiglu_mod (zero bias): the task's outputs exactly"),
    "k5_gemm_rmsnorm_partial_cross_entropy": (
        k5, "quack rstd_lse_epi: stores the logits (M x V), target logit gathered from them"),
    "k6_gemm_residual_partial_rmsnorm_bwd": (
        k6, "quack rms_bwd_apply_epi: deferred-rstd convention, does not store h (less work)"),
}

#: where the library epilogue does less than the task, the diagnostic (DIAGNOSTICS) that does
#: the same work as the library: "at least as fast as the library" compares that one
LIKE_FOR_LIKE = {"k6_gemm_residual_partial_rmsnorm_bwd": "without_h"}


def alternatives() -> dict:
    """{task name: (fn(inputs, config), note, TUNED)}."""
    return {name: (fn, note, TUNED[name]) for name, (fn, note) in NOTES.items()}


# ---- diagnostics: the same kernel minus one piece of its work ---------------------------
# Not alternatives (they do less than the task): timed beside the expert kernel at ITS
# config, they say what that piece costs. k7 and k0 fold a per-row reduction besides
# loading C; dropping it separates the reduction's cost from the C loads' latency.

def _k0_without_sumsq():
    """quack's norm_act_mod with C and a rowvec, no activation: D = (acc + C) * w and the aux
    output (acc + C) * w: k0's loads and two stores without the sum-of-squares reduction
    (the aux holds y * w where k0 stores y: same bytes, one multiply more). Built on first
    use: it imports quack."""
    def make():
        from quack.epilogue.library import norm_act_mod

        return P.from_quack(norm_act_mod(None, gated=False, has_c=True, has_rowvec=True, has_colvec=False))

    return once(("k0_without_sumsq",), make)


dswiglu_no_zdz = P.from_quack("quack.epilogue.library:dswiglu_mod")


def k7_without_zdz(inputs, config):
    out = dswiglu_no_zdz(inputs["dout"], inputs["w_down"].T, c=inputs["z"], config=config)
    return {"dz": out["D"], "out": out["postact"]}


def k0_without_sumsq(inputs, config):
    out = _k0_without_sumsq()(inputs["a"], inputs["w_o"], c=inputs["residual"], mRowVecBroadcast=inputs["norm_weight"],
                              config=config)
    return {"h": out["D"], "x_times_w": out["mAuxOut"]}


@P.epilogue(
    operands={"x": P.Tile(), "rstd": P.PerRow(), "w": P.PerCol(), "zdz": P.PerRow(), "inv_d": P.Scalar()},
    reductions={"dw": P.ColReduce(product=True)},
)
def _k6_rmsnorm_bwd_without_h(acc, c, x, rstd, w, zdz, inv_d):
    # human_kernels/k6's rmsnorm_bwd minus its h output (the test checks dx and dw against the task)
    xhat = x * rstd
    return {"D": c + rstd * (acc * w - xhat * (zdz * inv_d)), "dw": (acc, xhat)}


def k6_without_h(inputs, config):
    w_gu = inputs["w_gu"]
    out = _k6_rmsnorm_bwd_without_h(
        inputs["dz"], w_gu.T, c=inputs["dx_in"], x=inputs["x"], rstd=inputs["rstd"], w=inputs["norm_weight"],
        zdz=inputs["zdz"], inv_d=1.0 / w_gu.shape[1], config=config)
    return {"dx": out["D"], "dw": P.finish.col_sum(out["dw"])}


# The traffic split: which of k7's / k0's DRAM streams costs the time. Synthetic (their
# values mean nothing), but each moves exactly the named bytes beside the kernel's own GEMM.

@P.epilogue(outputs=("a", "b"))
def _three_stores(acc):
    return {"D": acc, "a": acc * 2.0, "b": acc * 3.0}


@P.epilogue(outputs=("a",))
def _two_stores(acc):
    return {"D": acc, "a": acc * 2.0}


@P.epilogue(mode="packed_pair")
def _swiglu_bwd_without_postact(acc, c):
    gate, up = P.unpack(c)
    sig = P.sigmoid(gate)
    silu = gate * sig
    return {"D": P.pack(acc * up * (sig + silu * (1.0 - sig)), acc * silu)}


@P.epilogue(outputs=("postact",), mode="packed_pair")
def _swiglu_bwd_io_only(acc, c):
    gate, up = P.unpack(c)
    return {"D": P.pack(acc * up, acc * gate), "postact": gate * up}


def k7_c_and_stores(inputs, config):
    """k7's C load and all three of its stores (dz packed, postact), one multiply each in place
    of the SwiGLU backward's math, no reduction: the floor of any k7 epilogue that reads and
    writes what the task does, at this config."""
    out = _swiglu_bwd_io_only(inputs["dout"], inputs["w_down"].T, c=inputs["z"], config=config)
    return {"dz": out["D"], "out": out["postact"]}


def k7_stores_only(inputs, config):
    """k7's store bytes (D = two (M, F) halves + postact (M, F): three (M, F) bf16 tensors), no C."""
    out = _three_stores(inputs["dout"], inputs["w_down"].T, config=config)
    return {"D": out["D"], "a": out["a"], "b": out["b"]}


def k7_without_postact(inputs, config):
    """k7's C load and D store (its dz exactly), no postact store and no reduction."""
    out = _swiglu_bwd_without_postact(inputs["dout"], inputs["w_down"].T, c=inputs["z"], config=config)
    return {"dz": out["D"]}


def k0_stores_only(inputs, config):
    """k0's store bytes (h and resid_out: two (M, d) bf16 tensors), no C."""
    out = _two_stores(inputs["a"], inputs["w_o"], config=config)
    return {"D": out["D"], "a": out["a"]}


DIAGNOSTICS = {
    "k6_gemm_residual_partial_rmsnorm_bwd": {
        "without_h": (k6_without_h, "k6's epilogue without storing h (what quack's rms_bwd_apply_epi also skips)")},
    "k7_gemm_partial_swiglu_bwd": {
        "without_zdz": (k7_without_zdz, "quack dswiglu_mod: k7's C, D and postact without the ZdZ row reduction"),
        "stores_only": (k7_stores_only, "k7's store bytes (three M x F bf16 tensors) without loading C"),
        "without_postact": (k7_without_postact,
                            "k7's C load and D store without the postact store and the ZdZ reduction"),
        "c_and_stores": (k7_c_and_stores, "k7's C load and its three stores, one multiply each instead of the "
                                          "SwiGLU backward, no reduction")},
    "k0_gemm_residual_partial_rmsnorm": {
        "without_sumsq": (k0_without_sumsq, "quack norm_act_mod(C, rowvec): k0's C and two stores without the "
                                            "sum-of-squares row reduction"),
        "stores_only": (k0_stores_only, "k0's store bytes (two M x d bf16 tensors) without loading C")},
}
