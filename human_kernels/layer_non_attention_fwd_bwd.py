"""layer: a decoder layer's non-attention forward and backward as 12 fused GEMMs, the block
re-cut of CODA (training/model_ops.py decoder_block does the same with one op per kernel).

Forward: k0 (O-projection + residual, the post-attention norm's h and sums of squares), k2
(gate/up with the deferred rstd + SwiGLU), k0 again with layer i+1's norm weight, k4hf (QKV
with the deferred rstd + RoPE). Backward: RoPE's backward and the input norm's ZdZ in one
step, k6 (QKV dgrad + the norm's backward + dy), k7 (down dgrad + SwiGLU backward + ZdZ),
k6 (gate/up dgrad + the post-attention norm's backward), the O-projection's dgrad, and the
four weight gradients: plain GEMMs of the stored tensors, A read transposed."""

import primitives as P

TASK = "layer_non_attention_fwd_bwd"
AUTHOR = "epiforge maintainers"
ROPE_DIRECTION = 1  # the task's scalar rope_direction (Hugging Face, quack's own)

residual_rms_partial = P.from_quack("quack.epilogue.library:rms_partial_epi")
qkv_rmsnorm_rope = P.from_quack("quack.epilogue.rotary:rstd_rope_posfreq_epi")
swiglu_bwd_zdz = P.from_quack("quack.epilogue.library:dswiglu_dpreact_mod")


@P.epilogue(outputs=("out",), operands={"rstd": P.PerRow()}, mode="acc_pair")
def rmsnorm_swiglu(acc, rstd):
    gate, up = P.unpack(acc * rstd)
    return {"D": P.pack(gate, up), "out": P.swiglu(gate, up)}


@P.epilogue(
    outputs=("h",),
    operands={"x": P.Tile(), "rstd": P.PerRow(), "w": P.PerCol(), "zdz": P.PerRow(), "inv_d": P.Scalar()},
    reductions={"dw": P.ColReduce(product=True)},
)
def rmsnorm_bwd(acc, c, x, rstd, w, zdz, inv_d):
    xhat = x * rstd
    return {"D": c + rstd * (acc * w - xhat * (zdz * inv_d)), "h": xhat * w, "dw": (acc, xhat)}


@P.epilogue()
def plain(acc):
    return {"D": acc}


def prepare(consts):
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1],
                                                  direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    attn, w_o, w_gu, w_down, w_qkv = (inputs[k] for k in ("attn", "w_o", "w_gu", "w_down", "w_qkv"))
    d = w_o.shape[0]
    # forward
    o = residual_rms_partial(attn, w_o, c=inputs["x"], weight=inputs["post_norm"])
    x1 = o["resid_out"]
    rstd1 = P.finish.rstd_from_sumsq(o["sqsum"], n=d, eps=inputs["eps"])
    mlp = rmsnorm_swiglu(o["D"], w_gu, rstd=rstd1)
    z = mlp["D"]
    down = residual_rms_partial(mlp["out"], w_down, c=x1, weight=inputs["next_norm"])
    y = down["resid_out"]
    rstd2 = P.finish.rstd_from_sumsq(down["sqsum"], n=d, eps=inputs["eps"])
    qkv = qkv_rmsnorm_rope(down["D"], w_qkv, rstd=rstd2, pos=inputs["positions"], freq=prepared["freq"])["D"]
    # backward: layer i+1's input norm, then the MLP, then the O-projection
    dz_qkv, zdz2 = P.finish.rope_backward(inputs["dqkv"], qkv, inputs["positions"], inputs["inv_freq"], 2 * d,
                                          ROPE_DIRECTION)
    b2 = rmsnorm_bwd(dz_qkv, w_qkv.T, c=inputs["dy"], x=y, rstd=rstd2, w=inputs["next_norm"], zdz=zdz2, inv_d=1.0 / d)
    dy2 = b2["D"]
    d_next_norm = P.finish.col_sum(b2["dw"])
    dw_qkv = plain(dz_qkv.T, b2["h"].T)["D"]
    s = swiglu_bwd_zdz(dy2, w_down.T, c=z)
    dz = s["D"]
    zdz1 = P.finish.row_sum(s["dsum"])
    dw_down = plain(dy2.T, s["postact"].T)["D"]
    b1 = rmsnorm_bwd(dz, w_gu.T, c=dy2, x=x1, rstd=rstd1, w=inputs["post_norm"], zdz=zdz1, inv_d=1.0 / d)
    dx = b1["D"]
    d_post_norm = P.finish.col_sum(b1["dw"])
    dw_gu = plain(dz.T, b1["h"].T)["D"]
    return {
        "y": y, "qkv": qkv, "d_attn": plain(dx, w_o.T)["D"], "dx": dx, "dw_o": plain(dx.T, attn.T)["D"],
        "d_post_norm": d_post_norm, "dw_gu": dw_gu, "dw_down": dw_down, "d_next_norm": d_next_norm, "dw_qkv": dw_qkv,
    }
