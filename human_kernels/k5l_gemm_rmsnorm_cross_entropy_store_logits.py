"""k5l: k5's kernel with the logits stored: D = rstd * acc in bf16, besides the online
log-sum-exp partials and the target logit, both folded from the unrounded float32 logits."""

import primitives as P

TASK = "k5l_gemm_rmsnorm_cross_entropy_store_logits"
AUTHOR = "epiforge maintainers"

# not tuned for this task yet: k5's measured best configs (the same GEMM and epilogue, plus
# the D store), bench/results/h200 via human_kernels/k5_gemm_rmsnorm_partial_cross_entropy.py
TUNED = {
    "16384x32768x2048": "128x160_c1x2_pp",
    "16384x32768x4096": "128x160_c2x1_pp",
    "16384x32768x8192": "128x192_c2x1_pp_sw1",
    # the LLaMA-3.2-1B LM head (the training model's): k5's choice there, quack's default tile
    # (no config ran more than 1% faster for k5 in bench/results/h200/sweep-llama1b.json)
    "16384x128256x2048": "128x192_c2x1_pp",
}


@P.epilogue(
    operands={"rstd": P.PerRow()},
    reductions={"lse": P.RowLogSumExp(), "target_logit": P.RowSelect(index="targets")},
)
def rmsnorm_cross_entropy_logits(acc, rstd):
    logits = acc * rstd
    return {"D": logits, "lse": logits, "target_logit": logits}


def run(inputs, prepared, config=None):
    out = rmsnorm_cross_entropy_logits(
        inputs["h"], inputs["w_lm"], rstd=inputs["rstd"], targets=inputs["targets"], store_d=True,
        config=config or P.pick_config(TUNED, inputs["h"], inputs["w_lm"]))
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse, "logits": out["D"]}
