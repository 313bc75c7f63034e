import torch

from tasks import common


def make_inputs(dims, gen, device):
    M, d = dims["M"], dims["d"]
    h, rstd = common.deferred_rmsnorm_input(M, d, gen, device)
    return {
        "h": h,
        "rstd": rstd,
        "w_qkv": common.linear_weight(3 * d, d, gen, device),
        "positions": common.positions(M, dims["seq"], device),
        "inv_freq": common.rope_inv_freq(dims["head_dim"], device),
    }


def reference(inputs, dims, mm=torch.matmul):
    z = inputs["rstd"][:, None] * mm(inputs["h"], inputs["w_qkv"].T)
    return {"qkv": common.rope_interleaved(z, inputs["positions"], inputs["inv_freq"], 2 * dims["d"],
                                          direction=inputs["rope_direction"])}
