import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    M, d, hd = dims["M"], dims["d"], dims["head_dim"]
    return {
        "a": common.normal((M, d), gen, device, dtype=dtype),
        "w_qk": common.linear_weight(2 * d, d, gen, device, dtype=dtype),
        "q_norm_weight": common.norm_weight(hd, gen, device, dtype=dtype),
        "k_norm_weight": common.norm_weight(hd, gen, device, dtype=dtype),
        "positions": common.positions(M, dims["seq"], device),
        "inv_freq": common.rope_inv_freq(hd, device),
    }


def reference(inputs, dims, mm=torch.matmul):
    d, hd = dims["d"], dims["head_dim"]
    z = mm(inputs["a"], inputs["w_qk"].T)
    heads = z.reshape(z.shape[0], 2 * d // hd, hd)
    normed = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + inputs["eps"])
    weight = torch.stack([inputs["q_norm_weight"]] * (d // hd) + [inputs["k_norm_weight"]] * (d // hd))
    y = (normed * weight).reshape(z.shape)
    return {"qk": common.rope_interleaved(y, inputs["positions"], inputs["inv_freq"], 2 * d,
                                          direction=inputs["rope_direction"])}
