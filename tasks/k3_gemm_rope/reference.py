import torch

from tasks import common


def make_inputs(dims, gen, device):
    M, d = dims["M"], dims["d"]
    return {
        "a": common.normal((M, d), gen, device),
        "w_qkv": common.linear_weight(3 * d, d, gen, device),
        "positions": common.positions(M, dims["seq"], device),
        "inv_freq": common.rope_inv_freq(dims["head_dim"], device),
    }


def reference(inputs, dims, mm=torch.matmul):
    z = mm(inputs["a"], inputs["w_qkv"].T)
    return {"qkv": common.rope_interleaved(z, inputs["positions"], inputs["inv_freq"], 2 * dims["d"],
                                          direction=inputs["rope_direction"])}
