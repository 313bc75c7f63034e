"""k3d: fused QKV GEMM + RoPE on Q and K, with the pre-RoPE projection stored too (CODA v0.1's
kernel_3). D = acc (qkv_pre, rounded once to the run's precision); the rotated pairs of the same
unrounded float32 accumulator (P.rope_rotate, table holds -inv_freq for CODA's -angle, zero for V
columns: an exact identity) go to a pair output stored at full width beside it."""

import primitives as P

TASK = "k3d_gemm_rope_store_d"
SESSION = "20261207T213703Z-k3d-6c6fa5"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = -1  # the task's scalar rope_direction (CODA v0.1)

TUNED = {
}


@P.epilogue(pair_outputs=("rotated",), operands={"pos": P.PerRow(), "freq": P.PerCol()}, mode="acc_pair")
def qkv_rope_store_d(acc, pos, freq):
    x, y = P.unpack(acc)
    return {"D": acc, "rotated": P.pack(*P.rope_rotate(x, y, pos, freq))}


def prepare(consts):
    # w_qkv is (3d, d): q and k rotate by -pos * inv_freq, v passes through (zero frequency)
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1],
                                                  direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    out = qkv_rope_store_d(inputs["a"], inputs["w_qkv"], pos=inputs["positions"], freq=prepared["freq"],
                           config=config or P.pick_config(TUNED, inputs["a"], inputs["w_qkv"]))
    return {"qkv": out["rotated"], "qkv_pre": out["D"]}

