"""layer: A LLaMA decoder layer's non-attention forward and backward: 12 fused GEMMs.

Forward (each RMSNorm deferred to the consuming GEMM's row scale):
  o_proj   : x1 = attn @ w_o^T + x          -> D = h1 = x1 * post_norm, x1, sum(x1^2) partials
  gate_up  : z = rstd1 * (h1 @ w_gu^T)      -> D = z (interleaved gate/up), act = swiglu(z)
  down     : y = act @ w_down^T + x1        -> D = y, h2 = y * next_norm, sum(y^2) partials
  qkv      : qkv = rope(rstd2 * (h2 @ w_qkv^T))
Backward:
  rope_backward(dqkv, qkv)                  -> dz_qkv, zdz2 = sum z_qkv * dz_qkv
  qkv_dgrad: g2 = dz_qkv @ w_qkv            -> dy2 = dy + rstd2*nn*g2 - y*rstd2^2*zdz2/d,
                                               h2n = y*rstd2*nn, d_next_norm partials
  qkv_wgrad: dw_qkv = dz_qkv^T @ h2n
  down_dgrad: g = dy2 @ w_down (packed pairs over z) -> dz = dswiglu, zdz1 = sum z * dz
  down_wgrad: dw_down = dy2^T @ act
  gate_up_dgrad: g1 = dz @ w_gu             -> dx = dy2 + rstd1*pn*g1 - x1*rstd1^2*zdz1/d,
                                               h1n = x1*rstd1*pn, d_post_norm partials
  gate_up_wgrad: dw_gu = dz^T @ h1n
  o_dgrad : d_attn = dx @ w_o
  o_wgrad : dw_o = dx^T @ attn
"""

import primitives as P

TASK = "layer_non_attention_fwd_bwd"
SESSION = "20261207T215656Z-layer-86437d"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Per-epilogue tile configs (none measured on a GPU in this session): 128x128 pingpong for the
# epilogues that load C / tiles (the docs' advice for heavy and paired epilogues with row
# reductions), quack's default for the plain GEMMs.
HEAVY = P.GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True)
LIGHT = P.DEFAULT_CONFIG


# ---------------------------------------------------------------- forward

@P.epilogue(outputs=("x1",), operands={"pn": P.PerCol()}, reductions={"sumsq": P.RowReduce(product=True)})
def o_proj_residual(acc, c, pn):
    x1 = acc + c
    return {"D": x1 * pn, "x1": x1, "sumsq": (x1, x1)}


@P.epilogue(outputs=("act",), operands={"rstd": P.PerRow()}, mode="acc_pair")
def gate_up_swiglu(acc, rstd):
    z = acc * rstd
    gate, up = P.unpack(z)
    return {"D": z, "act": P.swiglu(gate, up)}


@P.epilogue(outputs=("h2",), operands={"nn": P.PerCol()}, reductions={"sumsq": P.RowReduce(product=True)})
def down_residual(acc, c, nn):
    y = acc + c
    return {"D": y, "h2": y * nn, "sumsq": (y, y)}


@P.epilogue(operands={"rstd": P.PerRow(), "pos": P.PerRow(), "freq": P.PerCol()}, mode="acc_pair")
def qkv_norm_rope(acc, rstd, pos, freq):
    x, y = P.unpack(acc * rstd)
    return {"D": P.pack(*P.rope_rotate(x, y, pos, freq))}


# ---------------------------------------------------------------- backward

@P.epilogue(outputs=("hn",), operands={"t": P.Tile(), "rstd": P.PerRow(), "zdz": P.PerRow(),
                                        "gamma": P.PerCol(), "inv_n": P.Scalar()},
            reductions={"dgamma": P.ColReduce(product=True)})
def rmsnorm_dgrad(acc, c, t, rstd, zdz, gamma, inv_n):
    # acc: gradient at the normalised, weighted input; t: the norm's input; c: the residual gradient
    that = t * rstd
    coef = rstd * zdz * inv_n
    return {"D": c + rstd * gamma * acc - that * coef, "hn": that * gamma, "dgamma": (acc, that)}


@P.epilogue(reductions={"zdz": P.RowReduce()}, mode="packed_pair")
def swiglu_dgrad(acc, c):
    gate, up = P.unpack(c)
    d_gate, d_up, _ = P.dswiglu(gate, up, acc)
    return {"D": P.pack(d_gate, d_up), "zdz": gate * d_gate + up * d_up}


@P.epilogue()
def plain(acc):
    return {"D": acc}


def prepare(consts):
    d = consts["w_qkv"].shape[1]
    direction = consts.get("rope_direction", 1.0)
    direction = 1 if direction is None or float(direction) > 0 else -1
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=d, direction=direction)}


def run(inputs, prepared, config=None):
    attn, x = inputs["attn"], inputs["x"]
    w_o, w_gu, w_down, w_qkv = inputs["w_o"], inputs["w_gu"], inputs["w_down"], inputs["w_qkv"]
    pn, nn = inputs["post_norm"], inputs["next_norm"]
    pos, inv_freq = inputs["positions"], inputs["inv_freq"]
    dqkv, dy = inputs["dqkv"], inputs["dy"]
    eps = inputs["eps"]
    d = x.shape[1]
    heavy = config or HEAVY
    light = config or LIGHT

    # forward
    o = o_proj_residual(attn, w_o, c=x, pn=pn, config=heavy)
    h1, x1 = o["D"], o["x1"]
    rstd1 = P.finish.rstd_from_sumsq(o["sumsq"], n=d, eps=eps)
    gu = gate_up_swiglu(h1, w_gu, rstd=rstd1, config=heavy)
    z, act = gu["D"], gu["act"]
    dn = down_residual(act, w_down, c=x1, nn=nn, config=heavy)
    y, h2 = dn["D"], dn["h2"]
    rstd2 = P.finish.rstd_from_sumsq(dn["sumsq"], n=d, eps=eps)
    qkv = qkv_norm_rope(h2, w_qkv, rstd=rstd2, pos=pos, freq=prepared["freq"], config=light)["D"]

    # backward
    dz_qkv, zdz2 = P.finish.rope_backward(dqkv, qkv, pos, inv_freq, 2 * d, inputs["rope_direction"])
    qd = rmsnorm_dgrad(dz_qkv, w_qkv.T, c=dy, t=y, rstd=rstd2, zdz=zdz2, gamma=nn, inv_n=1.0 / d, config=heavy)
    dy2, h2n = qd["D"], qd["hn"]
    d_next_norm = P.finish.col_sum(qd["dgamma"])
    dw_qkv = plain(dz_qkv.T, h2n.T, config=light)["D"]
    dd = swiglu_dgrad(dy2, w_down.T, c=z, config=heavy)
    dz = dd["D"]
    zdz1 = P.finish.row_sum(dd["zdz"])
    dw_down = plain(dy2.T, act.T, config=light)["D"]
    gd = rmsnorm_dgrad(dz, w_gu.T, c=dy2, t=x1, rstd=rstd1, zdz=zdz1, gamma=pn, inv_n=1.0 / d, config=heavy)
    dx, h1n = gd["D"], gd["hn"]
    d_post_norm = P.finish.col_sum(gd["dgamma"])
    dw_gu = plain(dz.T, h1n.T, config=light)["D"]
    d_attn = plain(dx, w_o.T, config=light)["D"]
    dw_o = plain(dx.T, attn.T, config=light)["D"]

    return {"y": y, "qkv": qkv, "d_attn": d_attn, "dx": dx, "dw_o": dw_o, "d_post_norm": d_post_norm,
            "dw_gu": dw_gu, "dw_down": dw_down, "d_next_norm": d_next_norm, "dw_qkv": dw_qkv}

