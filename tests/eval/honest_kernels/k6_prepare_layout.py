"""k6 whose prepare() stores the dgrad GEMM's weight once in (N, K) layout (a transposed
copy: the same numbers, no strided reads in run()) and the norm weight in float32."""

import torch

import primitives as P

TASK = "k6_gemm_residual_partial_rmsnorm_bwd"
AUTHOR = "tests: honest kernels"


@P.epilogue(
    outputs=("h",),
    operands={"x": P.Tile(), "rstd": P.PerRow(), "w": P.PerCol(), "zdz": P.PerRow(), "inv_d": P.Scalar()},
    reductions={"dw": P.ColReduce(product=True)},
)
def rmsnorm_bwd(acc, c, x, rstd, w, zdz, inv_d):
    xhat = x * rstd
    return {"D": c + rstd * (acc * w - xhat * (zdz * inv_d)), "h": xhat * w, "dw": (acc, xhat)}


def prepare(consts):
    w_gu = consts["w_gu"]  # (2F, d): the dgrad GEMM reads its transpose, (N=d, K=2F)
    w_dgrad = w_gu.T.contiguous().clone()
    assert w_dgrad.shape == (w_gu.shape[1], w_gu.shape[0]) and w_dgrad.dtype == w_gu.dtype
    return {"w_dgrad": w_dgrad, "w": consts["norm_weight"].to(torch.float32)}


def run(inputs, prepared, config=None):
    w_dgrad = prepared["w_dgrad"]
    out = rmsnorm_bwd(
        inputs["dz"], w_dgrad, c=inputs["dx_in"], x=inputs["x"], rstd=inputs["rstd"], w=prepared["w"],
        zdz=inputs["zdz"], inv_d=1.0 / w_dgrad.shape[0], config=config,
    )
    return {"dx": out["D"], "h": out["h"], "dw": P.finish.col_sum(out["dw"])}
