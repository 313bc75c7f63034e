"""k6: RMSNorm backward in the gate/up dgrad GEMM's epilogue. acc = g (gradient at the
norm's output); the per-row correction arrives finished as zdz (from k7), so everything
else is elementwise: dx = dx_in + rstd * (w*g - xhat * zdz/d)."""

import primitives as P

TASK = "k6_gemm_residual_partial_rmsnorm_bwd"
AUTHOR = "epiforge maintainers"

# measured best tile configs on the H200 by GEMM m x n x k, written by
# python -m bench.tuning --write from:
#   bench/results/h200/sweep.json bench/results/h200/sweep-cs.json
#   bench/results/h200/sweep-c8.json bench/results/h200/confirm.json
TUNED = {
    "16384x2048x11264": "128x128_c1x2_pp_cs1",  # 1.043 of GEMM-only
    "16384x4096x22016": "192x128_c1x2_pp",  # 1.013 of GEMM-only
    "16384x8192x44032": "192x128_c1x2_pp",  # 1.008 of GEMM-only
    # LLaMA-3.2-1B's shape (bench/run.py --shape-set llama1b, bench/results/h200/sweep-llama1b.json)
    "16384x2048x16384": "128x128_c1x2_pp",  # 1.035 of GEMM-only
    # the 1B model's LM-head dgrad (K = V; --shape-set llama1b-k6): the one entry measured on
    # an H100, not the H200, where this shape has no sweep yet (bench/results/h100/
    # sweep-llama1b-k6): 1.023 of GEMM-only, where the nearest shape's 128x128_c1x2_pp took 1.193
    "16384x2048x128256": "256x128_c1x2_cs1",
    # LLaMA-3's 8B and 70B layers (bench/run.py --shape-set llama3): the H100's fastest
    # (bench/results/h100/sweep-llama3); on the H200 within 1.3 % of the fastest (1.013,
    # 1.021; bench/results/h200/sweep-llama3)
    "16384x4096x28672": "192x128_c1x2_pp",  # 1.046 of GEMM-only
    "16384x8192x57344": "192x128_c1x2_pp",  # 1.056 of GEMM-only
}


@P.epilogue(
    outputs=("h",),
    operands={"x": P.Tile(), "rstd": P.PerRow(), "w": P.PerCol(), "zdz": P.PerRow(), "inv_d": P.Scalar()},
    reductions={"dw": P.ColReduce(product=True)},
)
def rmsnorm_bwd(acc, c, x, rstd, w, zdz, inv_d):
    xhat = x * rstd
    return {"D": c + rstd * (acc * w - xhat * (zdz * inv_d)), "h": xhat * w, "dw": (acc, xhat)}


def run(inputs, prepared, config=None):
    w_gu = inputs["w_gu"]  # (2F, d): the dgrad GEMM's B is its transpose, (N=d, K=2F)
    out = rmsnorm_bwd(
        inputs["dz"], w_gu.T, c=inputs["dx_in"], x=inputs["x"], rstd=inputs["rstd"],
        w=inputs["norm_weight"], zdz=inputs["zdz"], inv_d=1.0 / w_gu.shape[1], config=config or P.pick_config(TUNED, inputs["dz"], w_gu.T),
    )
    return {"dx": out["D"], "h": out["h"], "dw": P.finish.col_sum(out["dw"])}
