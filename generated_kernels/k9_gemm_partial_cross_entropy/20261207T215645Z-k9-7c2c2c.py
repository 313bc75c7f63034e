"""k9: LM-head GEMM + cross-entropy forward, logits never stored.

The epilogue folds each row's float32 logits (the unrounded accumulator) into an online
log-sum-exp partial per N-tile and picks the target logit; store_d=False, so the M x V
logits never reach memory. The finishing step folds the tiles: lse, loss = lse - target.
"""

import primitives as P

TASK = "k9_gemm_partial_cross_entropy"
SESSION = "20261207T215645Z-k9-7c2c2c"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# k5's measured best configs on the H200 (same GEMM shapes, the same epilogue minus the
# per-row scale); the 7B shape falls back to quack's default tile.
TUNED = {
    "16384x32768x2048": "128x160_c1x2_pp",
    "16384x32768x8192": "128x192_c2x1_pp_sw1",
}


@P.epilogue(reductions={"lse": P.RowLogSumExp(), "target_logit": P.RowSelect(index="targets")})
def lm_head_cross_entropy(acc):
    return {"lse": acc, "target_logit": acc}


def run(inputs, prepared, config=None):
    a, w = inputs["a"], inputs["w_lm"]
    out = lm_head_cross_entropy(
        a, w, targets=inputs["targets"], store_d=False,
        config=config or P.pick_config(TUNED, a, w),
    )
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse}

