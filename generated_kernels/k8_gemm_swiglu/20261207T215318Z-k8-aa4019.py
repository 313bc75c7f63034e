"""k8: Gate/up GEMM + SwiGLU. acc_pair mode: each (gate, up) pair is two adjacent columns
of the interleaved weight; D keeps the pre-activation z, out = silu(gate) * up."""

import primitives as P

TASK = "k8_gemm_swiglu"
SESSION = "20261207T215318Z-k8-aa4019"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Tile configs by GEMM m x n x k. These are the GEMM shapes k2 (the same epilogue plus a
# per-row scale) was tuned on with the H200; k8 itself was not swept here.
TUNED = {
    "16384x11264x2048": "128x160_c2x1_pp",
    "16384x22016x4096": "128x128_c2x1_pp",
    "16384x44032x8192": "128x128_c2x1_pp",
}


@P.epilogue(outputs=("out",), mode="acc_pair")
def gemm_swiglu(acc):
    gate, up = P.unpack(acc)
    return {"D": P.pack(gate, up), "out": P.swiglu(gate, up)}


def run(inputs, prepared, config=None):
    a, w = inputs["a"], inputs["w_gu"]
    res = gemm_swiglu(a, w, config=config or P.pick_config(TUNED, a, w))
    return {"z": res["D"], "out": res["out"]}

