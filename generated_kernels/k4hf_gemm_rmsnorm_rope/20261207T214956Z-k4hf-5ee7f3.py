"""k4hf: fused QKV GEMM + deferred RMSNorm row scale + RoPE (Hugging Face's +angle).

acc_pair epilogue: the row's rstd scales the float32 accumulator pair, then q and k pairs
rotate by +pos * inv_freq (angle in float-float turns from a per-column table; zero
frequency for v columns, an exact identity). One rounding, to the inputs' dtype."""

import primitives as P

TASK = "k4hf_gemm_rmsnorm_rope"
SESSION = "20261207T214956Z-k4hf-5ee7f3"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = 1  # the task's scalar rope_direction (Hugging Face)

# k1's / k4's light-epilogue configs on the H200 (row scale + rotation follow the GEMM)
TUNED = {
    "16384x6144x2048": "128x128_c1x2_pp",
    "16384x12288x4096": "128x128_c1x2_pp",
}


@P.epilogue(operands={"rstd": P.PerRow(), "pos": P.PerRow(), "freq": P.PerCol()}, mode="acc_pair")
def rstd_rope(acc, rstd, pos, freq):
    x, y = P.unpack(acc * rstd)
    return {"D": P.pack(*P.rope_rotate(x, y, pos, freq))}


def prepare(consts):
    # w_qkv is (3d, d) = [q; k; v]: q and k rotate by +pos * inv_freq, v passes through
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1],
                                                  direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_qkv"]
    out = rstd_rope(h, w, rstd=inputs["rstd"], pos=inputs["positions"], freq=prepared["freq"],
                    dtypes={"D": h.dtype}, config=config or P.pick_config(TUNED, h, w))
    return {"qkv": out["D"]}

