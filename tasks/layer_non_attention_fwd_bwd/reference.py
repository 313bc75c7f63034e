"""The non-attention part of a LLaMA decoder layer, forward and backward, written out: the
forward as the fused cut computes it (each norm deferred to the next GEMM), the backward as
the chain k6 -> k7 -> k6 with the weight gradients. `store` marks every tensor a fused
pipeline writes to memory and another kernel reads back (Task.reference rounds it once to
the run's precision in the low-precision reference; the exact one keeps it); values an epilogue uses
straight from its accumulator are not stored. tests/tasks/test_layer_task.py checks the written
backward against torch.autograd of the forward in float64."""

import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    M, d, F = dims["M"], dims["d"], dims["F"]
    return {
        "attn": common.normal((M, d), gen, device, dtype=dtype),
        "x": common.normal((M, d), gen, device, dtype=dtype),
        "w_o": common.linear_weight(d, d, gen, device, dtype=dtype),
        "post_norm": common.norm_weight(d, gen, device, dtype=dtype),
        "w_gu": common.linear_weight(2 * F, d, gen, device, dtype=dtype),
        "w_down": common.linear_weight(d, F, gen, device, dtype=dtype),
        "next_norm": common.norm_weight(d, gen, device, dtype=dtype),
        "w_qkv": common.linear_weight(3 * d, d, gen, device, dtype=dtype),
        "positions": common.positions(M, dims["seq"], device),
        "inv_freq": common.rope_inv_freq(dims["head_dim"], device),
        "dqkv": common.normal((M, 3 * d), gen, device, std=1e-2, dtype=dtype),
        "dy": common.normal((M, d), gen, device, std=1e-2, dtype=dtype),
    }


def forward(inputs, dims, mm=torch.matmul, store=None) -> dict:
    """The forward: y and qkv, and what the backward reads (each as a fused cut stores it).
    store: Task.reference's (see the module's docstring); by default, plain PyTorch's."""
    store = store or common.held_in(inputs["attn"].dtype)
    eps, d = inputs["eps"], dims["d"]
    x1_acc = mm(inputs["attn"], inputs["w_o"].T) + inputs["x"]  # k0: the residual add in the epilogue
    x1, rstd1 = store(x1_acc), common.rstd_of(x1_acc, eps)
    z_acc = rstd1[:, None] * mm(store(x1_acc * inputs["post_norm"]), inputs["w_gu"].T)  # k2
    z, act = store(z_acc), store(common.swiglu_interleaved(z_acc))
    y_acc = mm(act, inputs["w_down"].T) + x1  # k0 with the next layer's norm weight
    y, rstd2 = store(y_acc), common.rstd_of(y_acc, eps)
    qkv_acc = common.rope_interleaved(rstd2[:, None] * mm(store(y_acc * inputs["next_norm"]), inputs["w_qkv"].T),
                                      inputs["positions"], inputs["inv_freq"], 2 * d, direction=inputs["rope_direction"])
    return {"y": y, "qkv": store(qkv_acc), "x1": x1, "rstd1": rstd1, "z": z, "rstd2": rstd2}


def _norm_backward(g, x, rstd, weight, zdz, dx_in, d):
    """k6's epilogue: the RMSNorm's backward from the gradient g at its output, the row sums
    zdz of the GEMM after it, and the residual gradient dx_in; also the normalised input
    (the weight gradient's B) and the norm weight's gradient."""
    xhat = x * rstd[:, None]
    return dx_in + rstd[:, None] * (weight * g - xhat * (zdz[:, None] / d)), xhat * weight, \
        common.at_least_float32(g * xhat).sum(0)


def reference(inputs, dims, mm=torch.matmul, store=None):
    store = store or common.held_in(inputs["attn"].dtype)
    d = dims["d"]
    fw = forward(inputs, dims, mm, store)
    # RoPE's backward (the rotation back) and ZdZ of the input norm, in one step
    dz_qkv = store(common.rope_interleaved(inputs["dqkv"], inputs["positions"], inputs["inv_freq"], 2 * d,
                                          direction=-inputs["rope_direction"]))
    zdz2 = common.at_least_float32(fw["qkv"] * inputs["dqkv"]).sum(-1)
    dy2, h2, d_next_norm = _norm_backward(mm(dz_qkv, inputs["w_qkv"]), fw["y"], fw["rstd2"], inputs["next_norm"],
                                          zdz2, inputs["dy"], d)
    dy2, h2 = store(dy2), store(h2)
    # k7: the down projection's dgrad with the SwiGLU backward (z as stored), act recomputed
    g_act = mm(dy2, inputs["w_down"])
    gate, up = fw["z"][:, 0::2], fw["z"][:, 1::2]
    s = torch.sigmoid(gate)
    dz_acc = torch.stack((g_act * up * s * (1 + gate * (1 - s)), g_act * gate * s), dim=-1).flatten(1)
    dz, act = store(dz_acc), store(gate * s * up)
    zdz1 = common.at_least_float32(fw["z"] * dz_acc).sum(-1)
    dx, h1, d_post_norm = _norm_backward(mm(dz, inputs["w_gu"]), fw["x1"], fw["rstd1"], inputs["post_norm"], zdz1,
                                         dy2, d)
    dx, h1 = store(dx), store(h1)
    return {
        "y": fw["y"], "qkv": fw["qkv"], "dx": dx, "d_attn": mm(dx, inputs["w_o"]),
        "dw_o": mm(dx.T, inputs["attn"]), "d_post_norm": d_post_norm, "dw_gu": mm(dz.T, h1),
        "dw_down": mm(dy2.T, act), "d_next_norm": d_next_norm, "dw_qkv": mm(dz_qkv.T, h2),
    }
