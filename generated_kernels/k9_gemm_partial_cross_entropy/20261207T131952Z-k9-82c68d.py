"""k9: LM-head GEMM + cross-entropy forward. The epilogue folds each row's float32 logits
(the unrounded accumulator) into online log-sum-exp partials per N-tile and selects the
target logit; the logits never reach memory (store_d=False). P.finish.cross_entropy folds
the tiles: lse = logsumexp over tiles, loss = lse - target_logit."""

import primitives as P

TASK = "k9_gemm_partial_cross_entropy"
SESSION = "20261207T131952Z-k9-82c68d"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# k5's measured best configs (the same GEMM and the same reductions, minus the rstd scale)
TUNED = {
    "16384x32768x2048": "128x160_c1x2_pp",
    "16384x32768x8192": "128x192_c2x1_pp_sw1",
    "16384x128256x2048": "128x192_c2x1_pp",
}


@P.epilogue(
    reductions={"lse": P.RowLogSumExp(), "target_logit": P.RowSelect(index="targets")},
)
def cross_entropy(acc):
    return {"lse": acc, "target_logit": acc}


def run(inputs, prepared, config=None):
    out = cross_entropy(
        inputs["a"], inputs["w_lm"], targets=inputs["targets"], store_d=False,
        config=config or P.pick_config(TUNED, inputs["a"], inputs["w_lm"]))
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse}

