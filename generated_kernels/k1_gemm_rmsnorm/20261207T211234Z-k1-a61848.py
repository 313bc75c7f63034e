"""k1: GEMM with the deferred RMSNorm row scale (fused QKV projection, no RoPE):
out = rstd[:, None] * (h @ w^T), the row scale applied to the float32 accumulator in the
epilogue and rounded once to the inputs' dtype."""

import primitives as P

TASK = "k1_gemm_rmsnorm"
SESSION = "20261207T211234Z-k1-a61848"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# tile configs by GEMM m x n x k: the same GEMMs as k4 (QKV projection, a per-row scale in
# the epilogue), whose measured picks these follow; 70B falls back to the nearest entry.
TUNED = {
    "16384x6144x2048": "128x192_c1x2_pp",
    "16384x12288x4096": "128x192_c2x1_pp",
}


@P.epilogue(operands={"rstd": P.PerRow()})
def rmsnorm_scale(acc, rstd):
    return {"D": acc * rstd}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w"]
    out = rmsnorm_scale(h, w, rstd=inputs["rstd"], dtypes={"D": h.dtype},
                        config=config or P.pick_config(TUNED, h, w))
    return {"out": out["D"]}

