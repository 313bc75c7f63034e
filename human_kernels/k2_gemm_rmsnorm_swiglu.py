"""k2: row scale by rstd, then SwiGLU on the interleaved (gate, up) column pairs; D keeps
the scaled pre-activation for the backward."""

import primitives as P

TASK = "k2_gemm_rmsnorm_swiglu"
AUTHOR = "epiforge maintainers"


@P.epilogue(outputs=("out",), operands={"rstd": P.PerRow()}, mode="acc_pair")
def rmsnorm_swiglu(acc, rstd):
    gate, up = P.unpack(acc * rstd)
    return {"D": P.pack(gate, up), "out": P.swiglu(gate, up)}


def run(inputs, prepared, config=None):
    out = rmsnorm_swiglu(inputs["h"], inputs["w_gu"], rstd=inputs["rstd"], config=config)
    return {"z": out["D"], "out": out["out"]}
