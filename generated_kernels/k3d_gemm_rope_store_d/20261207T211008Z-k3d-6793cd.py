"""k3d: Fused QKV GEMM + RoPE on Q and K, with the pre-RoPE projection stored too (CODA v0.1's
kernel_3). One acc_pair epilogue: D = the float32 accumulator (qkv_pre, rounded once), and the
rotated pairs of that same unrounded float32 value (P.rope_rotate with a per-column frequency
table holding rope_direction * inv_freq for q/k columns and 0 for v, an exact identity) go to a
pair output stored at full width beside it."""

import primitives as P

TASK = "k3d_gemm_rope_store_d"
SESSION = "20261207T211008Z-k3d-6793cd"
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
    # w_qkv is (3d, d): q and k rotate (by -pos * inv_freq: the task's rope_direction), v passes through
    direction = consts.get("rope_direction", ROPE_DIRECTION)
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1],
                                                  direction=direction)}


def run(inputs, prepared, config=None):
    a, w = inputs["a"], inputs["w_qkv"]
    out = qkv_rope_store_d(a, w, pos=inputs["positions"], freq=prepared["freq"],
                           dtypes={"D": a.dtype, "rotated": a.dtype},
                           config=config or P.pick_config(TUNED, a, w))
    return {"qkv": out["rotated"], "qkv_pre": out["D"]}

