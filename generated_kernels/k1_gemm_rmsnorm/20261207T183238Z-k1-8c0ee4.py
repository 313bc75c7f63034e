"""k1: GEMM with the deferred RMSNorm row scale (fused QKV projection, no RoPE).

out = rstd[:, None] * (h @ w^T): one fused GEMM whose epilogue scales each float32
accumulator element by its row's rstd (a PerRow operand) and rounds once at the store.
D follows the inputs' dtype (bf16 or fp16) by default."""

import primitives as P

TASK = "k1_gemm_rmsnorm"
SESSION = "20261207T183238Z-k1-8c0ee4"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"


@P.epilogue(operands={"rstd": P.PerRow()})
def rmsnorm_row_scale(acc, rstd):
    return {"D": acc * rstd}


def run(inputs, prepared, config=None):
    out = rmsnorm_row_scale(inputs["h"], inputs["w"], rstd=inputs["rstd"], config=config)
    return {"out": out["D"]}

