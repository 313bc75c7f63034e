"""k0: Out-projection GEMM + residual add + RMSNorm with the rstd deferred.

One fused GEMM: acc = a @ w_o^T; the epilogue adds the residual (the GEMM's C operand),
stores x = acc + residual as D and h = x * norm_weight as an extra output, and folds the
float32 (unrounded) x*x into per-tile row partials. The finishing step turns those partials
into rstd = rsqrt(mean(x^2) + eps). x*x vanishes at ragged-tile overhang (acc = c = 0), so
the sum of squares is exact for any tile shape.
"""

import primitives as P

TASK = "k0_gemm_residual_partial_rmsnorm"
SESSION = "20261207T183925Z-k0-4b6d67"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Tile configs by GEMM m x n x k. 128x128_c1x2_pp is the config the maintainers' H200 log
# (docs/logs/h200-expert-kernels.md, "Still short of target") reports for this epilogue
# (C + D + one extra output + a row sum of squares) at the 1B / 7B / 70B shapes; pingpong
# 128x128 overlaps the C-loading epilogue with the other warpgroup's mainloop.
TUNED = {
    "16384x2048x2048": "128x128_c1x2_pp",
    "16384x4096x4096": "128x128_c1x2_pp",
    "16384x8192x8192": "128x128_c1x2_pp",
}


@P.epilogue(
    outputs=("h",),
    operands={"norm_weight": P.PerCol()},
    reductions={"sumsq": P.RowReduce(product=True)},
)
def residual_rmsnorm(acc, c, norm_weight):
    x = acc + c
    return {"D": x, "h": x * norm_weight, "sumsq": (x, x)}


def run(inputs, prepared, config=None):
    a, w = inputs["a"], inputs["w_o"]
    cfg = config or P.pick_config(TUNED, a, w)
    out = residual_rmsnorm(
        a, w, c=inputs["residual"], norm_weight=inputs["norm_weight"], config=cfg,
        dtypes={"D": a.dtype, "h": a.dtype},
    )
    rstd = P.finish.rstd_from_sumsq(out["sumsq"], n=w.shape[0], eps=inputs["eps"])
    return {"x": out["D"], "h": out["h"], "rstd": rstd}

