"""k5: LM-head GEMM + final deferred RMSNorm row scale + cross-entropy forward.

The GEMM reads h = x * norm_weight; the epilogue scales each accumulator row by rstd[m]
(float32, unrounded), then folds the scaled logits into per-tile online log-sum-exp
partials and picks the target logit; logits never reach memory (store_d=False).
P.finish.cross_entropy gives lse and loss.
"""

import primitives as P

TASK = "k5_gemm_rmsnorm_partial_cross_entropy"
SESSION = "20261207T214956Z-k5-8a2432"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# k9's measured best configs (the same GEMM shapes and nearly the same epilogue: one
# extra per-row multiply by rstd).
TUNED = {
    "16384x32768x2048": "128x192_c2x1_pp",
    "16384x32768x8192": "128x192_c1x2_pp",
}


@P.epilogue(operands={"rstd": P.PerRow()},
            reductions={"lse": P.RowLogSumExp(), "target_logit": P.RowSelect(index="targets")})
def rstd_lse_target(acc, rstd):
    logit = acc * rstd
    return {"lse": logit, "target_logit": logit}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_lm"]
    out = rstd_lse_target(h, w, rstd=inputs["rstd"], targets=inputs["targets"], store_d=False,
                          config=config or P.pick_config(TUNED, h, w))
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse}

