"""gg: Gate/up GEMM + GeGLU (tanh GELU). The interleaved (gate, up) columns arrive as one
pair in acc_pair mode; D keeps the raw float32 accumulator rounded once (the pre-activation
z), and out = gelu_tanh(gate) * up is computed in float32 and rounded once."""

import primitives as P

TASK = "gg_gemm_geglu"
SESSION = "20261207T203906Z-gg-748212"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Same GEMM shapes as k8_gemm_swiglu (same structure: acc_pair, D + one half-width output);
# its measured H200 configs.
TUNED = {
    "16384x11264x2048": "128x128_c2x1_pp",
    "16384x22016x4096": "128x128_c1x2_pp",
    "16384x44032x8192": "128x192_c1x2_pp",
}


@P.epilogue(outputs=("out",), mode="acc_pair")
def geglu(acc):
    gate, up = P.unpack(acc)
    return {"out": P.gelu_tanh(gate) * up}


def run(inputs, prepared, config=None):
    a, w = inputs["a"], inputs["w_gu"]
    out = geglu(a, w, config=config or P.pick_config(TUNED, a, w),
                dtypes={"D": a.dtype, "out": a.dtype})
    return {"z": out["D"], "out": out["out"]}

