"""k2: Gate/up GEMM + deferred RMSNorm row scale + SwiGLU. The epilogue applies rstd[m] to each
interleaved (gate, up) accumulator pair, stores the pre-activation z = rstd * acc as D, and
out = silu(gate) * up from the unrounded float32 z."""

import primitives as P

TASK = "k2_gemm_rmsnorm_swiglu"
SESSION = "20261207T183925Z-k2-513a8c"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# the k8 (gate/up SwiGLU) tile configs: same GEMM shapes, a per-row scale added
TUNED = {
    "16384x11264x2048": "128x128_c2x1_pp",
    "16384x22016x4096": "128x128_c1x2_pp",
    "16384x44032x8192": "128x192_c1x2_pp",
}


@P.epilogue(outputs=("out",), operands={"rstd": P.PerRow()}, mode="acc_pair")
def rstd_swiglu(acc, rstd):
    z = acc * rstd
    gate, up = P.unpack(z)
    return {"D": z, "out": P.swiglu(gate, up)}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_gu"]
    dt = h.dtype
    out = rstd_swiglu(
        h, w, rstd=inputs["rstd"],
        config=config or P.pick_config(TUNED, h, w),
        dtypes={"D": dt, "out": dt},
    )
    return {"z": out["D"], "out": out["out"]}

