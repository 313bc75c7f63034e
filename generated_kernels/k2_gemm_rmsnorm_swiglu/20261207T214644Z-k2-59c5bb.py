"""k2: gate/up GEMM + deferred RMSNorm row scale + SwiGLU, in one acc_pair epilogue.

The GEMM reads h = x * norm_weight; the epilogue completes the RMSNorm with the per-row
rstd, stores the pre-activation z = rstd * acc (both lanes, as D) and out = silu(gate) * up
from the unrounded float32 z."""

import primitives as P

TASK = "k2_gemm_rmsnorm_swiglu"
SESSION = "20261207T214644Z-k2-59c5bb"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# The same GEMMs as k8 (gate/up SwiGLU, whose epilogue differs from this one by one per-row
# multiply); k8's measured best tiles on the H200, carried over (not re-measured for k2).
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
    res = rstd_swiglu(h, w, rstd=inputs["rstd"], config=config or P.pick_config(TUNED, h, w))
    return {"z": res["D"], "out": res["out"]}

