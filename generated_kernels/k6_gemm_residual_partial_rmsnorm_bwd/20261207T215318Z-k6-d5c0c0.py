"""k6: Gate/up dgrad GEMM + RMSNorm backward + residual gradient, in one epilogue.

acc = g = dz @ w_gu (w passed as w_gu.T, a view: nn.Linear layout (N=d, K=2F)).
C is dx_in (the residual-stream gradient); x is a second loaded tile.
  xhat = x * rstd
  D    = dx = dx_in + rstd * (norm_weight * g - xhat * zdz / d)
  h    = xhat * norm_weight
  dw   = per-M-tile partials of g * xhat (ColReduce, product), folded by col_sum.
The dw term vanishes on ragged overhang (x and acc read 0 there), so it is ragged-safe.
"""

import primitives as P

TASK = "k6_gemm_residual_partial_rmsnorm_bwd"
SESSION = "20261207T215318Z-k6-d5c0c0"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# No configs measured on a GPU for this kernel in this session: the table stays empty and
# the kernel uses an explicit fallback below (the nearest analogue, k0's long-K pick:
# 192x128 pingpong, where C loads and stores were cheapest for a C-loading two-store
# epilogue). Measure before filling TUNED.
TUNED = {}
FALLBACK = P.GemmConfig(tile_m=192, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True)


@P.epilogue(
    outputs=("h",),
    operands={
        "x": P.Tile(),
        "rstd": P.PerRow(),
        "zdz": P.PerRow(),
        "nw": P.PerCol(),
        "inv_d": P.Scalar(),
    },
    reductions={"dw": P.ColReduce(product=True)},
)
def rms_bwd_residual(acc, c, x, rstd, zdz, nw, inv_d):
    xhat = x * rstd
    dx = c + rstd * (nw * acc - xhat * (zdz * inv_d))
    return {"D": dx, "h": xhat * nw, "dw": (acc, xhat)}


def run(inputs, prepared, config=None):
    dz = inputs["dz"]
    w = inputs["w_gu"].T  # (d, 2F): nn.Linear layout for D = dz @ w_gu
    d = w.shape[0]
    if config is None:
        config = P.pick_config(TUNED, dz, w) if TUNED else FALLBACK
    out = rms_bwd_residual(
        dz,
        w,
        c=inputs["dx_in"],
        x=inputs["x"],
        rstd=inputs["rstd"],
        zdz=inputs["zdz"],
        nw=inputs["norm_weight"],
        inv_d=1.0 / d,
        config=config,
    )
    return {"dx": out["D"], "h": out["h"], "dw": P.finish.col_sum(out["dw"])}

