"""k6: Gate/up dgrad GEMM + RMSNorm backward + residual gradient, in one dgrad epilogue.

acc = g = dz @ w_gu (the gradient at h = xhat * norm_weight). With the row correction
already known as zdz = sum_k z_k dz_k, the epilogue writes
  D  = dx = dx_in + rstd * (norm_weight * g - xhat * zdz / d)   (dx_in through the C path)
  h  = xhat * norm_weight                                       (recomputed, for the weight grad)
  dw = per-M-tile partials of sum_m g * xhat                    (ColReduce, product: 0 where acc = 0)
and col_sum folds dw's partials.
"""

import primitives as P

TASK = "k6_gemm_residual_partial_rmsnorm_bwd"
SESSION = "20261207T212227Z-k6-cc7bf3"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"


@P.epilogue(
    outputs=("h",),
    operands={"x": P.Tile(), "rstd": P.PerRow(), "zdz": P.PerRow(), "nw": P.PerCol(), "inv_d": P.Scalar()},
    reductions={"dw": P.ColReduce(product=True)},
)
def rmsnorm_bwd_residual(acc, c, x, rstd, zdz, nw, inv_d):
    xhat = x * rstd
    dx = c + rstd * (acc * nw - xhat * (zdz * inv_d))
    return {"D": dx, "h": xhat * nw, "dw": (acc, xhat)}


def run(inputs, prepared, config=None):
    dz, w_gu = inputs["dz"], inputs["w_gu"]
    b = w_gu.T  # (d, 2F): nn.Linear layout for acc = dz @ w_gu
    d = w_gu.shape[1]
    out = rmsnorm_bwd_residual(
        dz, b, c=inputs["dx_in"], x=inputs["x"], rstd=inputs["rstd"], zdz=inputs["zdz"],
        nw=inputs["norm_weight"], inv_d=1.0 / d, config=config,
        dtypes={"D": dz.dtype, "h": dz.dtype},
    )
    return {"dx": out["D"], "h": out["h"], "dw": P.finish.col_sum(out["dw"])}

