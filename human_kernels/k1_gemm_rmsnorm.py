"""k1: the deferred RMSNorm's row scale applied in the consuming GEMM's epilogue."""

import primitives as P

TASK = "k1_gemm_rmsnorm"
AUTHOR = "epiforge maintainers"

# measured best tile configs on the H200 by GEMM m x n x k, written by
# python -m bench.tuning --write from:
#   bench/results/h200/sweep.json bench/results/h200/sweep-cs.json
#   bench/results/h200/sweep-c8.json bench/results/h200/confirm.json
TUNED = {
    "16384x6144x2048": "128x128_c1x2_pp",  # 1.001 of GEMM-only
    "16384x12288x4096": "128x128_c1x2_pp",  # 1.005 of GEMM-only
    "16384x24576x8192": "128x128_c1x2_pp",  # 1.004 of GEMM-only
}


@P.epilogue(operands={"rstd": P.PerRow()})
def row_scale(acc, rstd):
    return {"D": acc * rstd}


def run(inputs, prepared, config=None):
    out = row_scale(inputs["h"], inputs["w"], rstd=inputs["rstd"], config=config or P.pick_config(TUNED, inputs["h"], inputs["w"]))
    return {"out": out["D"]}
