"""k0: out-projection + residual + RMSNorm statistics, with quack's rms_partial_epi
(y = acc + C; D = y * weight; resid_out = y; per-tile sum of y^2), then rstd."""

import primitives as P

TASK = "k0_gemm_residual_partial_rmsnorm"
AUTHOR = "quack library (CODA's authors)"

residual_rms_partial = P.from_quack("quack.epilogue.library:rms_partial_epi")


def run(inputs, prepared, config=None):
    out = residual_rms_partial(
        inputs["a"], inputs["w_o"], c=inputs["residual"], weight=inputs["norm_weight"], config=config
    )
    rstd = P.finish.rstd_from_sumsq(out["sqsum"], n=inputs["w_o"].shape[0], eps=inputs["eps"])
    return {"x": out["resid_out"], "h": out["D"], "rstd": rstd}
