"""k6: gate/up dgrad GEMM (g = dz @ w_gu) with the RMSNorm backward and the residual gradient
in its epilogue.

Per element (acc = g, float32):
    xhat = x * rstd
    dx   = dx_in + rstd * (norm_weight * g - xhat * zdz / d)      -> D (the C operand is dx_in)
    h    = xhat * norm_weight                                       -> extra output
    dw partials: per-M-tile column sums of g * xhat (ColReduce, product=True; 0 where acc and
    x are 0, so ragged tiles are safe), folded by P.finish.col_sum.
"""

import torch
import primitives as P

TASK = "k6_gemm_residual_partial_rmsnorm_bwd"
SESSION = "20261207T130620Z-k6-46f4cb"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# GEMM m x n x k = M x d x 2F
TUNED = {
    "16384x2048x11264": "128x128_c1x2_pp",
    "16384x4096x22016": "128x128_c1x2_pp",
    "16384x8192x44032": "128x128_c1x2_pp",
}


@P.epilogue(
    outputs=("h",),
    operands={"x": P.Tile(), "rstd": P.PerRow(), "zdz": P.PerRow(), "nw": P.PerCol(), "inv_d": P.Scalar()},
    reductions={"dw": P.ColReduce(product=True)},
)
def rmsnorm_bwd_residual(acc, c, x, rstd, zdz, nw, inv_d):
    xhat = x * rstd
    corr = zdz * inv_d
    dx = c + rstd * (nw * acc - xhat * corr)
    return {"D": dx, "h": xhat * nw, "dw": (acc, xhat)}


def run(inputs, prepared, config=None):
    dz, w_gu = inputs["dz"], inputs["w_gu"]
    d = w_gu.shape[1]
    b = w_gu.T  # (N=d, K=2F) view: acc = dz @ w_gu
    dt = dz.dtype
    out = rmsnorm_bwd_residual(
        dz, b,
        c=inputs["dx_in"], x=inputs["x"], rstd=inputs["rstd"], zdz=inputs["zdz"],
        nw=inputs["norm_weight"], inv_d=1.0 / d,
        dtypes={"D": dt, "h": dt},
        config=config or P.pick_config(TUNED, dz, b),
    )
    return {"dx": out["D"], "h": out["h"], "dw": P.finish.col_sum(out["dw"])}

