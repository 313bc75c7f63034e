"""k0: Out-projection GEMM + residual add + RMSNorm with the rstd deferred.

One fused GEMM: acc = a @ w_o^T; the epilogue adds the residual (the GEMM's C), stores
x = acc + c as D, stores h = x * norm_weight as an extra output, and folds x*x (float32,
unrounded) into per-tile row partials. The finisher rstd_from_sumsq turns the partials into
rstd = rsqrt(mean(x^2) + eps). x*x vanishes where acc = c = 0, so ragged tiles are safe.
"""

import primitives as P

TASK = "k0_gemm_residual_partial_rmsnorm"
SESSION = "20261207T211234Z-k0-4f63aa"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# NOT measured on a GPU in this session: 128x128 pingpong is the docs' recommended starting
# tile for C-loading epilogues with a row reduction (docs/logs/h200-expert-kernels.md: wider
# pingpong tiles make a per-row reduction expensive; k6's tuned entries use 128x128 / 192x128).
TUNED = {
    "16384x2048x2048": "128x128_c1x2_pp",
    "16384x4096x4096": "128x128_c1x2_pp",
    "16384x8192x8192": "128x128_c1x2_pp",
}


@P.epilogue(
    outputs=("h",),
    operands={"nw": P.PerCol()},
    reductions={"sumsq": P.RowReduce(product=True)},
)
def residual_rmsnorm_partial(acc, c, nw):
    x = acc + c
    return {"D": x, "h": x * nw, "sumsq": (x, x)}


def run(inputs, prepared, config=None):
    a, w_o = inputs["a"], inputs["w_o"]
    cfg = config or P.pick_config(TUNED, a, w_o)
    out = residual_rmsnorm_partial(
        a, w_o, c=inputs["residual"], nw=inputs["norm_weight"], config=cfg,
        dtypes={"D": a.dtype, "h": a.dtype},
    )
    rstd = P.finish.rstd_from_sumsq(out["sumsq"], n=w_o.shape[0], eps=inputs["eps"])
    return {"x": out["D"], "h": out["h"], "rstd": rstd}

