"""k4: the deferred RMSNorm row scale, then RoPE, with quack's rstd_rope_posfreq_epi."""

import primitives as P

TASK = "k4_gemm_rmsnorm_rope"
AUTHOR = "quack library (CODA's authors)"

qkv_rmsnorm_rope = P.from_quack("quack.epilogue.rotary:rstd_rope_posfreq_epi")


def prepare(consts):
    d = consts["w_qkv"].shape[1]
    head_dim = 2 * consts["inv_freq"].shape[0]
    return {"freq": P.prepare.rope_freq_table(consts["inv_freq"], head_dim, rotary_cols=2 * d, passthrough_cols=d)}


def run(inputs, prepared, config=None):
    out = qkv_rmsnorm_rope(
        inputs["h"], inputs["w_qkv"], rstd=inputs["rstd"], pos=inputs["positions"], freq=prepared["freq"], config=config
    )
    return {"qkv": out["D"]}
