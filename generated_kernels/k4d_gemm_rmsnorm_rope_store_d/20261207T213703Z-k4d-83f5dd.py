"""k4d: fused QKV GEMM + deferred RMSNorm row scale + RoPE, the pre-RoPE projection stored too
(CODA v0.1's kernel_4). acc_pair mode: z = rstd[m] * acc in float32; D = z (qkv_pre, rounded once),
and the rotated pairs of the same unrounded z go to a full-width pair output (qkv). The frequency
table holds -inv_freq (CODA's -angle) for q and k columns and 0 for v (an exact identity)."""

import primitives as P

TASK = "k4d_gemm_rmsnorm_rope_store_d"
SESSION = "20261207T213703Z-k4d-83f5dd"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = -1  # the task's scalar rope_direction (CODA v0.1)

# no GPU measurements for this task: empty table -> DEFAULT_CONFIG (128x192, cluster 2x1, pingpong)
TUNED = {
}


@P.epilogue(pair_outputs=("rotated",), operands={"rstd": P.PerRow(), "pos": P.PerRow(), "freq": P.PerCol()},
            mode="acc_pair")
def qkv_rmsnorm_rope_store_d(acc, rstd, pos, freq):
    x, y = P.unpack(acc * rstd)
    return {"D": P.pack(x, y), "rotated": P.pack(*P.rope_rotate(x, y, pos, freq))}


def prepare(consts):
    # w_qkv is (3d, d): q and k rotate (by -pos * inv_freq), v passes through
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1],
                                                  direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_qkv"]
    out = qkv_rmsnorm_rope_store_d(h, w, rstd=inputs["rstd"], pos=inputs["positions"], freq=prepared["freq"],
                                   config=config or P.pick_config(TUNED, h, w),
                                   dtypes={"D": h.dtype, "rotated": h.dtype})
    return {"qkv": out["rotated"], "qkv_pre": out["D"]}

