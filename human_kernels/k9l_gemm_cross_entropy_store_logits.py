"""k9l: k9's kernel (quack's lse_target_epi) with the logits stored: D = the bf16 logits,
besides the online log-sum-exp partials and the target logit of each row."""

import primitives as P

TASK = "k9l_gemm_cross_entropy_store_logits"
AUTHOR = "quack library (CODA's authors)"

# not tuned for this task yet: k9's measured best configs (the same GEMM and epilogue, plus
# the D store), bench/results/h200 via human_kernels/k9_gemm_partial_cross_entropy.py
TUNED = {
    "16384x32768x2048": "128x192_c2x1_pp",
    "16384x32768x4096": "128x160_c2x1_pp",
    "16384x32768x8192": "128x192_c1x2_pp",
}

lm_head_cross_entropy = P.from_quack("quack.epilogue.library:lse_target_epi")


def run(inputs, prepared, config=None):
    out = lm_head_cross_entropy(inputs["a"], inputs["w_lm"], target=inputs["targets"], store_d=True,
                                config=config or P.pick_config(TUNED, inputs["a"], inputs["w_lm"]))
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse, "logits": out["D"]}
