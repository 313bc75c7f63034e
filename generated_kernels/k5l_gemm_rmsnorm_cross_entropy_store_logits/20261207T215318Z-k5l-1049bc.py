"""k5l: LM-head GEMM + deferred RMSNorm row scale + cross-entropy forward, the 16-bit logits
stored (CODA v0.1's kernel). D = rstd * acc rounded once to the input's precision; the online
log-sum-exp partials and the target logit fold the same unrounded float32 value."""

import primitives as P

TASK = "k5l_gemm_rmsnorm_cross_entropy_store_logits"
SESSION = "20261207T215318Z-k5l-1049bc"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# k9l's configs (the same GEMM, the same D store and the same lse/target reductions, plus a
# per-row scale): not measured for this task yet
TUNED = {
    "16384x32768x2048": "128x192_c2x1_pp",
    "16384x32768x8192": "128x192_c1x2_pp",
}


@P.epilogue(
    operands={"rstd": P.PerRow()},
    reductions={"lse": P.RowLogSumExp(), "target_logit": P.RowSelect(index="targets")},
)
def rmsnorm_cross_entropy_store_logits(acc, rstd):
    logits = acc * rstd
    return {"D": logits, "lse": logits, "target_logit": logits}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_lm"]
    out = rmsnorm_cross_entropy_store_logits(
        h, w, rstd=inputs["rstd"], targets=inputs["targets"], store_d=True,
        dtypes={"D": h.dtype}, config=config or P.pick_config(TUNED, h, w),
    )
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse, "logits": out["D"]}

