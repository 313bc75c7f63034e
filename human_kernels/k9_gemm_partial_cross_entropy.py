"""k9: LM head + cross-entropy forward with quack's lse_target_epi: online log-sum-exp
partials and the target logit; logits never stored (store_d=False)."""

import primitives as P

TASK = "k9_gemm_partial_cross_entropy"
AUTHOR = "quack library (CODA's authors)"

# measured best tile configs on the H200 by GEMM m x n x k, written by
# python -m bench.tuning --write from:
#   bench/results/h200/sweep.json bench/results/h200/sweep-cs.json
#   bench/results/h200/sweep-c8.json bench/results/h200/confirm.json
TUNED = {
    "16384x32768x2048": "128x192_c2x1_pp",  # 1.008 of GEMM-only
    "16384x32768x4096": "128x160_c2x1_pp",  # 1.003 of GEMM-only
    "16384x32768x8192": "128x192_c1x2_pp",  # 1.008 of GEMM-only
}

lm_head_cross_entropy = P.from_quack("quack.epilogue.library:lse_target_epi")


def run(inputs, prepared, config=None):
    out = lm_head_cross_entropy(inputs["a"], inputs["w_lm"], target=inputs["targets"], store_d=False, config=config or P.pick_config(TUNED, inputs["a"], inputs["w_lm"]))
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse}
