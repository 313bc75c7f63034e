"""k4: the deferred RMSNorm row scale, then RoPE, with quack's rstd_rope_posfreq_epi. quack
rotates by +angle (Hugging Face's direction); the task follows CODA v0.1's -angle, so the
frequency table holds -inv_freq."""

import primitives as P

TASK = "k4_gemm_rmsnorm_rope"
AUTHOR = "quack library (CODA's authors)"
ROPE_DIRECTION = -1  # the task's scalar rope_direction (CODA v0.1)

# measured best tile configs on the H200 by GEMM m x n x k, written by
# python -m bench.tuning --write from:
#   bench/results/h200/sweep.json bench/results/h200/sweep-cs.json
#   bench/results/h200/sweep-c8.json bench/results/h200/confirm.json
TUNED = {
    "16384x6144x2048": "128x192_c1x2_pp",  # 1.014 of GEMM-only
    "16384x12288x4096": "128x192_c2x1_pp",  # 1.002 of GEMM-only
    "16384x24576x8192": "128x128_c1x2_pp",  # 0.992 of GEMM-only
}

qkv_rmsnorm_rope = P.from_quack("quack.epilogue.rotary:rstd_rope_posfreq_epi")


def prepare(consts):
    # w_qkv is (3d, d): q and k rotate (by -pos * inv_freq: the task's rope_direction), v passes through
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1], direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    out = qkv_rmsnorm_rope(
        inputs["h"], inputs["w_qkv"], rstd=inputs["rstd"], pos=inputs["positions"], freq=prepared["freq"], config=config or P.pick_config(TUNED, inputs["h"], inputs["w_qkv"])
    )
    return {"qkv": out["D"]}
