"""k0: out-projection + residual + RMSNorm statistics, with quack's rms_partial_epi
(y = acc + C; D = y * weight; resid_out = y; per-tile sum of y^2), then rstd."""

import primitives as P

TASK = "k0_gemm_residual_partial_rmsnorm"
AUTHOR = "quack library (CODA's authors)"

# measured best tile configs on the H200 by GEMM m x n x k, written by
# python -m bench.tuning --write from:
#   bench/results/h200/sweep.json bench/results/h200/sweep-cs.json
#   bench/results/h200/sweep-c8.json bench/results/h200/confirm.json
TUNED = {
    "16384x2048x2048": "128x128_c1x2_pp",  # 1.107 of GEMM-only
    "16384x4096x4096": "128x128_c1x2_pp",  # 1.066 of GEMM-only
    "16384x8192x8192": "128x128_c1x2_pp_cs2",  # 1.012 of GEMM-only
    # the fused model's down projection + residual at LLaMA-3's 1B, 8B and 70B layers (K = F;
    # bench/run.py --shape-set llama3 --gemm-k F): the H100's fastest (bench/results/h100/
    # sweep-llama3; 128x128_c1x2_pp took 1.067, 1.104 and 1.873 there); on the H200 within
    # 1.8 % of the fastest (1.045, 1.008, 1.014; bench/results/h200/sweep-llama3)
    "16384x2048x8192": "192x128_c1x2_pp",  # 1.046 of GEMM-only
    "16384x4096x14336": "192x128_c1x2_pp",  # 1.012 of GEMM-only
    "16384x8192x28672": "192x128_c1x2_pp",  # 1.015 of GEMM-only
}

residual_rms_partial = P.from_quack("quack.epilogue.library:rms_partial_epi")


def run(inputs, prepared, config=None):
    out = residual_rms_partial(
        inputs["a"], inputs["w_o"], c=inputs["residual"], weight=inputs["norm_weight"], config=config or P.pick_config(TUNED, inputs["a"], inputs["w_o"])
    )
    rstd = P.finish.rstd_from_sumsq(out["sqsum"], n=inputs["w_o"].shape[0], eps=inputs["eps"])
    return {"x": out["resid_out"], "h": out["D"], "rstd": rstd}
