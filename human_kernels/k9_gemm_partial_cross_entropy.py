"""k9: LM head + cross-entropy forward with quack's lse_target_epi: online log-sum-exp
partials and the target logit; logits never stored (store_d=False)."""

import primitives as P

TASK = "k9_gemm_partial_cross_entropy"
AUTHOR = "quack library (CODA's authors)"

lm_head_cross_entropy = P.from_quack("quack.epilogue.library:lse_target_epi")


def run(inputs, prepared, config=None):
    out = lm_head_cross_entropy(inputs["a"], inputs["w_lm"], target=inputs["targets"], store_d=False, config=config)
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse}
