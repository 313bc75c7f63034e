"""k3d: fused QKV GEMM + RoPE on Q and K with the pre-RoPE projection stored too (CODA v0.1's
kernel_3). acc_pair mode: each accumulator pair (2j, 2j+1) is stored unrounded-once as D
(qkv_pre), and the float32 pair rotated by -pos * inv_freq (a per-column frequency table
holding -inv_freq for q and k columns, zero for v: an exact identity) goes to the pair
output "rotated" (qkv), stored at full width beside it. Both follow the inputs' dtype."""

import primitives as P

TASK = "k3d_gemm_rope_store_d"
SESSION = "20261207T214956Z-k3d-704c42"
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
    # w_qkv is (3d, d): q and k rotate (by -pos * inv_freq), v passes through (zero frequency)
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1],
                                                  direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    a, w = inputs["a"], inputs["w_qkv"]
    out = qkv_rope_store_d(a, w, pos=inputs["positions"], freq=prepared["freq"],
                           dtypes={"D": a.dtype, "rotated": a.dtype},
                           config=config or P.pick_config(TUNED, a, w))
    return {"qkv": out["rotated"], "qkv_pre": out["D"]}

