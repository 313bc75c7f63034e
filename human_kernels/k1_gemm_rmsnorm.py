"""k1: the deferred RMSNorm's row scale applied in the consuming GEMM's epilogue."""

import primitives as P

TASK = "k1_gemm_rmsnorm"
AUTHOR = "epiforge maintainers"


@P.epilogue(operands={"rstd": P.PerRow()})
def row_scale(acc, rstd):
    return {"D": acc * rstd}


def run(inputs, prepared, config=None):
    out = row_scale(inputs["h"], inputs["w"], rstd=inputs["rstd"], config=config)
    return {"out": out["D"]}
