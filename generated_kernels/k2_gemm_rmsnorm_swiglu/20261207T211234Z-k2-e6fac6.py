"""k2: Gate/up GEMM + deferred RMSNorm row scale + SwiGLU, one fused launch.

acc_pair mode: each (gate, up) column pair of the interleaved weight arrives as one pair;
the epilogue scales it by rstd[m] (completing the RMSNorm), stores the pre-activation
z = rstd * acc as D (both lanes, one rounding) and out = silu(gate) * up from the float32 z.
"""

import primitives as P

TASK = "k2_gemm_rmsnorm_swiglu"
SESSION = "20261207T211234Z-k2-e6fac6"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Same GEMM shapes as k8 (gate/up projection); k8's measured best tile configs.
TUNED = {
    "16384x11264x2048": "128x128_c2x1_pp",
    "16384x22016x4096": "128x128_c1x2_pp",
    "16384x44032x8192": "128x192_c1x2_pp",
}


@P.epilogue(outputs=("out",), operands={"rstd": P.PerRow()}, mode="acc_pair")
def rmsnorm_swiglu(acc, rstd):
    z = acc * rstd
    gate, up = P.unpack(z)
    return {"D": z, "out": P.swiglu(gate, up)}


def run(inputs, prepared, config=None):
    h, w_gu = inputs["h"], inputs["w_gu"]
    res = rmsnorm_swiglu(
        h, w_gu, rstd=inputs["rstd"],
        config=config or P.pick_config(TUNED, h, w_gu),
        dtypes={"D": h.dtype, "out": h.dtype},
    )
    return {"z": res["D"], "out": res["out"]}

