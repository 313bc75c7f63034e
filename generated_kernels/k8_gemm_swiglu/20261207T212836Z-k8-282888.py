"""k8: Gate/up GEMM + SwiGLU. acc_pair mode on the interleaved (gate, up) column pairs:
D keeps the raw pre-activation z (omitted from the return, so the accumulator is stored
once, rounded to a's dtype), and `out` is silu(gate) * up from the float32 accumulator."""

import primitives as P

TASK = "k8_gemm_swiglu"
SESSION = "20261207T212836Z-k8-282888"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Same GEMMs and the same epilogue shape as k2 (acc_pair, D + one half-width output), so
# its measured tile configs are reused here.
TUNED = {
    "16384x11264x2048": "128x160_c2x1_pp",
    "16384x22016x4096": "128x128_c2x1_pp",
    "16384x44032x8192": "128x128_c2x1_pp",
}


@P.epilogue(outputs=("out",), mode="acc_pair")
def swiglu(acc):
    gate, up = P.unpack(acc)
    return {"out": P.swiglu(gate, up)}   # no "D": D is the raw accumulator (z)


def run(inputs, prepared, config=None):
    a, w = inputs["a"], inputs["w_gu"]
    out = swiglu(a, w, config=config or P.pick_config(TUNED, a, w))
    return {"z": out["D"], "out": out["out"]}

