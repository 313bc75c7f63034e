"""k5: LM-head GEMM + final deferred RMSNorm row scale + cross-entropy forward.

One fused GEMM: acc = h @ w_lm^T (float32), the epilogue scales each row by rstd[m]
(deferred RMSNorm), folds the scaled logits into online log-sum-exp partials per N-tile and
picks the target logit (float32, unrounded); logits never reach memory (store_d=False).
The finishing step P.finish.cross_entropy gives lse and loss = lse - target_logit."""

import primitives as P

TASK = "k5_gemm_rmsnorm_partial_cross_entropy"
SESSION = "20261207T212227Z-k5-bd6934"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# k9's measured best configs on the H200 (same GEMM, same reductions, plus one PerRow load)
TUNED = {
    "16384x32768x2048": "128x192_c2x1_pp",
    "16384x32768x8192": "128x192_c1x2_pp",
}


@P.epilogue(operands={"rstd": P.PerRow()},
            reductions={"lse": P.RowLogSumExp(), "target_logit": P.RowSelect(index="targets")})
def rstd_lse_target(acc, rstd):
    z = acc * rstd                      # the logit: RMSNorm's row scale applied after the GEMM
    return {"lse": z, "target_logit": z}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_lm"]
    out = rstd_lse_target(h, w, rstd=inputs["rstd"], targets=inputs["targets"], store_d=False,
                          config=config or P.pick_config(TUNED, h, w))
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse}

