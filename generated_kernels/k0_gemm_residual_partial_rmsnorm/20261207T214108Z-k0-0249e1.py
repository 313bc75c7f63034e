"""k0: Out-projection GEMM + residual add + RMSNorm with the rstd deferred.

acc = a @ w_o^T (float32). The epilogue adds the residual (C), stores x as D, stores
h = x * norm_weight, and folds per-tile partial sums of x^2 from the unrounded float32 x
(x = acc + c vanishes in ragged overhang, so the sum is safe). rstd_from_sumsq finishes.
"""

import primitives as P

TASK = "k0_gemm_residual_partial_rmsnorm"
SESSION = "20261207T214108Z-k0-0249e1"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# 128x128 pingpong, cluster 1x2: the tile the docs name for k0's C-loading epilogue
# (6 A/B stages, cheap per-row reduction on 128-wide tiles).
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
    out = residual_rmsnorm(
        a, w, c=inputs["residual"], norm_weight=inputs["norm_weight"],
        config=config or P.pick_config(TUNED, a, w),
    )
    rstd = P.finish.rstd_from_sumsq(out["sumsq"], n=w.shape[0], eps=inputs["eps"])
    return {"x": out["D"], "h": out["h"], "rstd": rstd}

