"""k8: Gate/up GEMM + SwiGLU. acc_pair mode on the interleaved (gate, up) column pairs:
D keeps the pre-activation z (for the backward), `out` is silu(gate) * up, half the width.
Both are computed from the float32 accumulator and rounded once to a's dtype."""

import primitives as P

TASK = "k8_gemm_swiglu"
SESSION = "20261207T183238Z-k8-4aeba5"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Tile configs by GEMM m x n x k. Not measured for k8 itself: these are k2's measured H200
# picks (k2 = this epilogue plus a PerRow rstd multiply, the same GEMM shapes), the
# nearest measured stand-in for an equally light acc_pair SwiGLU epilogue.
TUNED = {
    "16384x11264x2048": "128x160_c2x1_pp",
    "16384x22016x4096": "128x128_c2x1_pp",
    "16384x44032x8192": "128x128_c2x1_pp",
    "16384x16384x2048": "128x192_c2x1_pp",
    "16384x28672x4096": "128x192_c2x1_pp",
    "16384x57344x8192": "128x192_c2x1_pp",
}


@P.epilogue(outputs=("out",), mode="acc_pair")
def swiglu(acc):
    gate, up = P.unpack(acc)
    return {"D": P.pack(gate, up), "out": P.swiglu(gate, up)}


def run(inputs, prepared, config=None):
    a, w = inputs["a"], inputs["w_gu"]
    res = swiglu(a, w, config=config or P.pick_config(TUNED, a, w))
    return {"z": res["D"], "out": res["out"]}

