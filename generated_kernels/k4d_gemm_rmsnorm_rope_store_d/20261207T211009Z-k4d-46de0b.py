"""k4d: Fused QKV GEMM + deferred RMSNorm row scale + RoPE, the pre-RoPE projection stored too
(CODA v0.1's kernel). One acc_pair epilogue: z = rstd[m] * acc (float32), D = z (qkv_pre, rounded
once), and the pair output "rotated" = RoPE(z) from the unrounded z, by -positions * inv_freq
(the frequency table holds -inv_freq for q and k columns, 0 for v: an exact identity)."""

import primitives as P

TASK = "k4d_gemm_rmsnorm_rope_store_d"
SESSION = "20261207T211009Z-k4d-46de0b"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = -1  # the task's scalar rope_direction (CODA v0.1)

# no GPU measurements for this task: empty table -> DEFAULT_CONFIG
TUNED = {
}


@P.epilogue(pair_outputs=("rotated",), operands={"rstd": P.PerRow(), "pos": P.PerRow(), "freq": P.PerCol()}, mode="acc_pair")
def qkv_rmsnorm_rope_store_d(acc, rstd, pos, freq):
    x, y = P.unpack(acc * rstd)
    return {"D": P.pack(x, y), "rotated": P.pack(*P.rope_rotate(x, y, pos, freq))}


def prepare(consts):
    # w_qkv is (3d, d): q and k rotate (by -pos * inv_freq), v passes through
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1], direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_qkv"]
    out = qkv_rmsnorm_rope_store_d(
        h, w, rstd=inputs["rstd"], pos=inputs["positions"], freq=prepared["freq"],
        dtypes={"D": h.dtype, "rotated": h.dtype},
        config=config or P.pick_config(TUNED, h, w),
    )
    return {"qkv": out["rotated"], "qkv_pre": out["D"]}

