"""k5: LM-head GEMM + final deferred RMSNorm row scale + cross-entropy forward.

One fused GEMM launch: the epilogue scales each accumulator row by rstd[m] (the deferred
RMSNorm), folds the scaled logits into online log-sum-exp partials (one per N-tile) and
picks the target logit (RowSelect), all in float32 from the unrounded accumulator; the
logits never reach memory (store_d=False). P.finish.cross_entropy gives lse and loss.
"""

import primitives as P

TASK = "k5_gemm_rmsnorm_partial_cross_entropy"
SESSION = "20261207T131952Z-k5-b6599a"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# the same GEMM and a near-identical (light) epilogue as k9: k9's measured H200 configs
TUNED = {
    "16384x32768x2048": "128x192_c2x1_pp",
    "16384x32768x8192": "128x192_c1x2_pp",
}


@P.epilogue(operands={"rstd": P.PerRow()},
            reductions={"lse": P.RowLogSumExp(), "target_logit": P.RowSelect(index="targets")})
def rstd_lse_target(acc, rstd):
    z = acc * rstd
    return {"lse": z, "target_logit": z}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_lm"]
    out = rstd_lse_target(h, w, rstd=inputs["rstd"], targets=inputs["targets"], store_d=False,
                          config=config or P.pick_config(TUNED, h, w))
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse}

