"""gg: Gate/up GEMM + GeGLU (tanh GELU), one fused GEMM launch.

acc_pair mode: each (gate, up) pair is two adjacent accumulator columns (the weight's rows
are interleaved). D keeps the raw float32 accumulator rounded once (z, the pre-activation
the backward needs); `out` = gelu_tanh(gate) * up, computed in float32 from the unrounded
accumulator and rounded once to the inputs' dtype.
"""

import primitives as P

TASK = "gg_gemm_geglu"
SESSION = "20261207T213240Z-gg-e5970a"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Same GEMM shapes and the same epilogue structure (acc_pair, D + one half-width output) as
# k8_gemm_swiglu; these are k8's H200-measured configs, borrowed (not re-measured for GeGLU).
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
    dt = a.dtype
    res = geglu(a, w, config=config or P.pick_config(TUNED, a, w), dtypes={"D": dt, "out": dt})
    return {"z": res["D"], "out": res["out"]}

