"""k1: GEMM with the deferred RMSNorm row scale (fused QKV projection, no RoPE):
out = rstd[:, None] * (h @ w^T), the row scale applied to the float32 accumulator and
rounded once to the inputs' dtype."""

import primitives as P

TASK = "k1_gemm_rmsnorm"
SESSION = "20261207T214108Z-k1-c5e10d"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"


@P.epilogue(operands={"rstd": P.PerRow()})
def rmsnorm_rowscale(acc, rstd):
    return {"D": acc * rstd}


def run(inputs, prepared, config=None):
    out = rmsnorm_rowscale(inputs["h"], inputs["w"], rstd=inputs["rstd"], config=config)
    return {"out": out["D"]}

