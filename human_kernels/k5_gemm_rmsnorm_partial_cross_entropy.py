"""k5: row scale by rstd, then the online log-sum-exp and the target logit of each row;
the logits are never stored (store_d=False)."""

import primitives as P

TASK = "k5_gemm_rmsnorm_partial_cross_entropy"
AUTHOR = "epiforge maintainers"

# measured best tile configs on the H200 by GEMM m x n x k, written by
# python -m bench.tuning --write from:
#   bench/results/h200/sweep.json bench/results/h200/sweep-cs.json
#   bench/results/h200/sweep-c8.json bench/results/h200/confirm.json
TUNED = {
    "16384x32768x2048": "128x160_c1x2_pp",  # 0.997 of GEMM-only
    "16384x32768x4096": "128x160_c2x1_pp",  # 1.009 of GEMM-only
    "16384x32768x8192": "128x192_c2x1_pp_sw1",  # 1.005 of GEMM-only
    # LLaMA-3.2-1B's shape (bench/run.py --shape-set llama1b, bench/results/h200/sweep-llama1b.json)
    "16384x128256x2048": "128x192_c2x1_pp",  # the default, the fastest median (12578 us; the paired-ratio pick 128x192_c1x2_pp took 12762 us there, and 13.9 ms against 11.1 ms in the training step's profile)
}


@P.epilogue(
    operands={"rstd": P.PerRow()},
    reductions={"lse": P.RowLogSumExp(), "target_logit": P.RowSelect(index="targets")},
)
def rmsnorm_cross_entropy(acc, rstd):
    logits = acc * rstd
    return {"lse": logits, "target_logit": logits}


def run(inputs, prepared, config=None):
    out = rmsnorm_cross_entropy(
        inputs["h"], inputs["w_lm"], rstd=inputs["rstd"], targets=inputs["targets"], store_d=False, config=config or P.pick_config(TUNED, inputs["h"], inputs["w_lm"])
    )
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse}
