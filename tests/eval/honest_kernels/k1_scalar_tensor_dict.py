"""k1 with a gain kept as a one-element tensor (operands.md: a Scalar may be a 1-element
tensor), prepared once, and the output returned through dict(...) with a keyword."""

import torch

import primitives as P

TASK = "k1_gemm_rmsnorm"
AUTHOR = "tests: honest kernels"


def prepare(consts):
    return {"gain": torch.ones(1)}


@P.epilogue(operands={"rstd": P.PerRow(), "gain": P.Scalar()})
def scaled_rows(acc, rstd, gain):
    return {"D": acc * rstd * gain}


def run(inputs, prepared, config=None):
    out = scaled_rows(inputs["h"], inputs["w"], rstd=inputs["rstd"], gain=prepared["gain"], config=config)
    return dict(out=out["D"])
