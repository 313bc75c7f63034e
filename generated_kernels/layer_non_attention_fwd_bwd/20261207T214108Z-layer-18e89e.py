"""layer: a LLaMA decoder layer's non-attention forward and backward in 12 fused GEMMs.

Forward (each RMSNorm deferred to the next GEMM's row scale):
  o_proj   : x1 = acc + x (c);  D = h1 = x1 * post_norm;  x1 stored;  sum(x1^2) partials
  gate_up  : z = acc * rstd1 (acc_pair);  D = z;  act = swiglu(z)
  down     : y = acc + x1 (c);  D = y;  h2 = y * next_norm;  sum(y^2) partials
  qkv      : qkv = rope(acc * rstd2) (acc_pair)
Backward:
  rope_backward: dz_qkv and zdz2 = sum(qkv * dqkv)
  qkv_dgrad    : g = acc;  D = dy2 = dy + r2*nn*g - y*r2^2*zdz2/d;  h2n = y*r2*nn;  d_next_norm partials
  qkv_wgrad    : dw_qkv = dz_qkv^T @ h2n
  down_dgrad   : packed_pair SwiGLU backward on z (c);  D = dz;  zdz1 partials
  down_wgrad   : dw_down = dy2^T @ act
  gate_up_dgrad: g = acc;  D = dx = dy2 + r1*pn*g - x1*r1^2*zdz1/d;  h1n = x1*r1*pn;  d_post_norm partials
  gate_up_wgrad: dw_gu = dz^T @ h1n
  o_dgrad      : d_attn = dx @ w_o
  o_wgrad      : dw_o = dx^T @ attn
"""

import primitives as P

TASK = "layer_non_attention_fwd_bwd"
SESSION = "20261207T214108Z-layer-18e89e"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Tile configs per GEMM role, by GEMM m x n x k (P.pick_config: the nearest listed shape).
# Not measured for this task: each entry is the config the H200 logs (docs/logs,
# examples/) report as measured best for the same kind of epilogue at the same GEMM shape.
ROLE_TUNED = {
    # k0-like residual + sum-of-squares epilogue (docs/logs/h200-expert-kernels.md)
    "o_proj": {"16384x2048x2048": "128x128_c1x2_pp", "16384x4096x4096": "128x128_c1x2_pp"},
    # k0-like after the down projection (long K): docs/gemm_config.md "Long K" (H200 and H100)
    "down": {"16384x2048x5632": "128x128_c1x2_pp", "16384x4096x11008": "128x128_c1x2_pp",
             "16384x8192x22016": "192x128_c1x2_pp"},
    # rstd + SwiGLU, acc_pair with an output: examples/k8_gemm_swiglu.py's table
    "gate_up": {"16384x11264x2048": "128x128_c2x1_pp", "16384x22016x4096": "128x128_c1x2_pp",
                "16384x44032x8192": "128x192_c1x2_pp"},
    # rstd + RoPE, acc_pair: examples/k3hf_gemm_rope.py's table
    "qkv": {"16384x6144x2048": "128x192_c1x2_pp", "16384x12288x4096": "128x192_c2x1_pp",
            "16384x24576x8192": "128x128_c1x2_pp"},
    # k7 SwiGLU backward with ZdZ (docs/logs/h200-expert-kernels.md)
    "swiglu_bwd": {"16384x5632x2048": "128x128_c1x2_pp_cs2", "16384x11008x4096": "128x128_c1x2_pp_cs2",
                   "16384x22016x8192": "128x192_c2x1_pp"},
    # k6 RMSNorm backward (C + tile loads; one C stage keeps the mainloop's A/B stages)
    "rms_bwd": {"16384x2048x11264": "128x128_c1x2_pp_cs1", "16384x8192x44032": "256x128_c1x2_cs1"},
}


def _cfg(config, role, a, w):
    if config is not None:
        return config
    table = ROLE_TUNED.get(role)
    return P.pick_config(table, a, w) if table else None


# ---------------------------------------------------------------- forward
@P.epilogue(outputs=("x1",), operands={"pn": P.PerCol()},
            reductions={"sumsq": P.RowReduce(product=True)})
def residual_norm_stats(acc, c, pn):
    x1 = acc + c
    return {"D": x1 * pn, "x1": x1, "sumsq": (x1, x1)}


@P.epilogue(outputs=("act",), operands={"rstd": P.PerRow()}, mode="acc_pair")
def rstd_swiglu(acc, rstd):
    z = acc * rstd
    gate, up = P.unpack(z)
    return {"D": z, "act": P.swiglu(gate, up)}


@P.epilogue(outputs=("h2",), operands={"nn": P.PerCol()},
            reductions={"sumsq": P.RowReduce(product=True)})
def residual_norm_stats_y(acc, c, nn):
    y = acc + c
    return {"D": y, "h2": y * nn, "sumsq": (y, y)}


@P.epilogue(operands={"rstd": P.PerRow(), "pos": P.PerRow(), "freq": P.PerCol()}, mode="acc_pair")
def rstd_rope(acc, rstd, pos, freq):
    x1, x2 = P.unpack(acc * rstd)
    return {"D": P.pack(*P.rope_rotate(x1, x2, pos, freq))}


# ---------------------------------------------------------------- backward
@P.epilogue(outputs=("hn",),
            operands={"xin": P.Tile(), "rstd": P.PerRow(), "zdz": P.PerRow(), "gamma": P.PerCol(),
                      "inv_d": P.Scalar()},
            reductions={"dgamma": P.ColReduce(product=True)})
def rms_bwd(acc, c, xin, rstd, zdz, gamma, inv_d):
    xhat = xin * rstd
    coef = rstd * zdz * inv_d
    dxin = c + rstd * gamma * acc - xhat * coef
    return {"D": dxin, "hn": xhat * gamma, "dgamma": (acc, xhat)}


@P.epilogue(reductions={"zdz": P.RowReduce()}, mode="packed_pair")
def swiglu_bwd(acc, c):
    gate, up = P.unpack(c)
    d_gate, d_up, _ = P.dswiglu(gate, up, acc)
    return {"D": P.pack(d_gate, d_up), "zdz": gate * d_gate + up * d_up}


@P.epilogue()
def plain(acc):
    return {"D": acc}


def prepare(consts):
    inv_freq = consts["inv_freq"]
    d = consts["w_qkv"].shape[1]
    return {"freq_pos": P.prepare.qkv_rope_freq_table(inv_freq, d=d, direction=1),
            "freq_neg": P.prepare.qkv_rope_freq_table(inv_freq, d=d, direction=-1)}


def run(inputs, prepared, config=None):
    attn, x = inputs["attn"], inputs["x"]
    w_o, w_gu, w_down, w_qkv = inputs["w_o"], inputs["w_gu"], inputs["w_down"], inputs["w_qkv"]
    pn, nn = inputs["post_norm"], inputs["next_norm"]
    pos, inv_freq = inputs["positions"], inputs["inv_freq"]
    dqkv, dy = inputs["dqkv"], inputs["dy"]
    eps, direction = inputs["eps"], inputs["rope_direction"]
    d = x.shape[1]
    inv_d = 1.0 / d
    freq = prepared["freq_pos"] if direction > 0 else prepared["freq_neg"]
    # ---- forward
    o = residual_norm_stats(attn, w_o, c=x, pn=pn, config=_cfg(config, "o_proj", attn, w_o))
    h1, x1 = o["D"], o["x1"]
    r1 = P.finish.rstd_from_sumsq(o["sumsq"], n=d, eps=eps)

    gu = rstd_swiglu(h1, w_gu, rstd=r1, config=_cfg(config, "gate_up", h1, w_gu))
    z, act = gu["D"], gu["act"]

    dn = residual_norm_stats_y(act, w_down, c=x1, nn=nn, config=_cfg(config, "down", act, w_down))
    y, h2 = dn["D"], dn["h2"]
    r2 = P.finish.rstd_from_sumsq(dn["sumsq"], n=d, eps=eps)

    qkv = rstd_rope(h2, w_qkv, rstd=r2, pos=pos, freq=freq, config=_cfg(config, "qkv", h2, w_qkv))["D"]

    # ---- backward
    dz_qkv, zdz2 = P.finish.rope_backward(dqkv, qkv, pos, inv_freq, 2 * d, direction)

    kq = rms_bwd(dz_qkv, w_qkv.T, c=dy, xin=y, rstd=r2, zdz=zdz2, gamma=nn, inv_d=inv_d,
                 config=_cfg(config, "rms_bwd", dz_qkv, w_qkv.T))
    dy2, h2n = kq["D"], kq["hn"]
    d_next_norm = P.finish.col_sum(kq["dgamma"])

    dw_qkv = plain(dz_qkv.T, h2n.T, config=config)["D"]

    kd = swiglu_bwd(dy2, w_down.T, c=z, config=_cfg(config, "swiglu_bwd", dy2, w_down.T))
    dz = kd["D"]
    zdz1 = P.finish.row_sum(kd["zdz"])

    dw_down = plain(dy2.T, act.T, config=config)["D"]

    kg = rms_bwd(dz, w_gu.T, c=dy2, xin=x1, rstd=r1, zdz=zdz1, gamma=pn, inv_d=inv_d,
                 config=_cfg(config, "rms_bwd", dz, w_gu.T))
    dx, h1n = kg["D"], kg["hn"]
    d_post_norm = P.finish.col_sum(kg["dgamma"])

    dw_gu = plain(dz.T, h1n.T, config=config)["D"]

    d_attn = plain(dx, w_o.T, config=config)["D"]
    dw_o = plain(dx.T, attn.T, config=config)["D"]

    return {"y": y, "qkv": qkv, "d_attn": d_attn, "dx": dx, "dw_o": dw_o, "d_post_norm": d_post_norm,
            "dw_gu": dw_gu, "dw_down": dw_down, "d_next_norm": d_next_norm, "dw_qkv": dw_qkv}

