"""k9: LM-head GEMM + cross-entropy forward, logits never stored. The epilogue folds the
float32 accumulator into per-(row, N-tile) online log-sum-exp partials and picks each row's
target logit (store_d=False); P.finish.cross_entropy folds the tiles into lse and the loss."""

import primitives as P

TASK = "k9_gemm_partial_cross_entropy"
SESSION = "20261207T212835Z-k9-927198"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# k5's measured best configs on the H200 (the same GEMM and an epilogue of the same shape:
# online log-sum-exp + target select, no D store)
TUNED = {
    "16384x32768x2048": "128x160_c1x2_pp",
    "16384x32768x8192": "128x192_c2x1_pp_sw1",
}


@P.epilogue(reductions={"lse": P.RowLogSumExp(), "target_logit": P.RowSelect(index="targets")})
def cross_entropy(acc):
    return {"lse": acc, "target_logit": acc}


def run(inputs, prepared, config=None):
    out = cross_entropy(
        inputs["a"], inputs["w_lm"], targets=inputs["targets"], store_d=False,
        config=config or P.pick_config(TUNED, inputs["a"], inputs["w_lm"]))
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse}

