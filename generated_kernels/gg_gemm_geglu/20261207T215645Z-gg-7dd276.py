"""gg: Gate/up GEMM + GeGLU (tanh GELU). acc_pair epilogue on the interleaved (gate, up)
column pairs: D keeps the raw accumulator (the pre-activation z for the backward), and
out = gelu_tanh(gate) * up, computed in float32 from the unrounded accumulator."""

import primitives as P

TASK = "gg_gemm_geglu"
SESSION = "20261207T215645Z-gg-7dd276"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# same GEMM shapes as k8 (SwiGLU); its measured best tile configs on the H200
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
    out = geglu(a, w, config=config or P.pick_config(TUNED, a, w))
    return {"z": out["D"], "out": out["out"]}

