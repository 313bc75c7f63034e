"""k9l: LM-head GEMM + cross-entropy forward, the 16-bit logits stored (CODA v0.1's kernel).

One fused GEMM: the epilogue stores D = acc (the logits, rounded once to a's dtype) and folds
the unrounded float32 accumulator into per-(row, N-tile) online log-sum-exp partials and the
target logit of each row. The cross_entropy finishing step reduces the partials to lse and
loss = lse - target_logit."""

import primitives as P

TASK = "k9l_gemm_cross_entropy_store_logits"
SESSION = "20261207T213240Z-k9l-b98ef5"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Same GEMM and epilogue shape as k5l (minus the per-row scale): its measured tile choices.
TUNED = {
    "16384x32768x2048": "128x160_c1x2_pp",
    "16384x32768x4096": "128x192_c2x1_pp",
    "16384x32768x8192": "128x192_c2x1_pp_sw1",
}


@P.epilogue(
    reductions={"lse": P.RowLogSumExp(), "target_logit": P.RowSelect(index="targets")},
)
def cross_entropy_logits(acc):
    return {"D": acc, "lse": acc, "target_logit": acc}


def run(inputs, prepared, config=None):
    a, w = inputs["a"], inputs["w_lm"]
    out = cross_entropy_logits(
        a, w, targets=inputs["targets"], store_d=True,
        config=config or P.pick_config(TUNED, a, w))
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse, "logits": out["D"]}

