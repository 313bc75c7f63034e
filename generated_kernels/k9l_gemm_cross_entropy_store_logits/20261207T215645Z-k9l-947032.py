"""k9l: LM-head GEMM + cross-entropy forward, the 16-bit logits stored (CODA v0.1's kernel).

One fused GEMM: the epilogue stores D = acc (the logits, rounded once to the inputs' dtype),
and from the unrounded float32 accumulator folds the online log-sum-exp partials per
(row, N-tile) and the target logit of each row. The finishing step cross_entropy folds the
partials into lse and loss = lse - target_logit.
"""

import primitives as P

TASK = "k9l_gemm_cross_entropy_store_logits"
SESSION = "20261207T215645Z-k9l-947032"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Same GEMM and the same epilogue as k5l (k5's measured H200 best configs, with the D store);
# k9l differs only by the absent per-row rstd scale.
TUNED = {
    "16384x32768x2048": "128x160_c1x2_pp",
    "16384x32768x8192": "128x192_c2x1_pp_sw1",
    "16384x128256x2048": "128x192_c2x1_pp",
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
        dtypes={"D": a.dtype},
        config=config or P.pick_config(TUNED, a, w))
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse, "logits": out["D"]}

