"""k4d: fused QKV GEMM + deferred RMSNorm row scale + RoPE, the pre-RoPE projection stored too.

acc_pair mode: each (2j, 2j+1) accumulator pair is scaled by the row's rstd in float32
(z = rstd * acc, completing the RMSNorm); D stores z (qkv_pre, rounded once), and the pair
output "rotated" stores RoPE(z) computed from the unrounded float32 z (qkv). The frequency
table holds -inv_freq for q and k (CODA's rope_direction = -1) and 0 for v (exact identity)."""

import primitives as P

TASK = "k4d_gemm_rmsnorm_rope_store_d"
SESSION = "20261207T214955Z-k4d-2fed32"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = -1  # the task's scalar rope_direction (CODA v0.1)

TUNED = {
}


@P.epilogue(pair_outputs=("rotated",), operands={"rstd": P.PerRow(), "pos": P.PerRow(), "freq": P.PerCol()},
            mode="acc_pair")
def qkv_rmsnorm_rope_store_d(acc, rstd, pos, freq):
    x, y = P.unpack(acc * rstd)
    r1, r2 = P.rope_rotate(x, y, pos, freq)
    return {"D": P.pack(x, y), "rotated": P.pack(r1, r2)}


def prepare(consts):
    # w_qkv is (3d, d): q and k rotate (by -pos * inv_freq), v passes through (frequency 0)
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1],
                                                  direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_qkv"]
    out = qkv_rmsnorm_rope_store_d(h, w, rstd=inputs["rstd"], pos=inputs["positions"], freq=prepared["freq"],
                                   config=config or P.pick_config(TUNED, h, w))
    return {"qkv": out["rotated"], "qkv_pre": out["D"]}

