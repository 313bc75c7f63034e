import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    M, d = dims["M"], dims["d"]
    return {
        "a": common.normal((M, d), gen, device, dtype=dtype),
        "w_qkv": common.linear_weight(3 * d, d, gen, device, dtype=dtype),
        "positions": common.positions(M, dims["seq"], device),
        "inv_freq": common.rope_inv_freq(dims["head_dim"], device),
    }


def rotate(z, inputs, dims):
    """z's q and k columns rotated in the task's direction (its scalar rope_direction), v as it is."""
    return common.rope_interleaved(z, inputs["positions"], inputs["inv_freq"], 2 * dims["d"],
                                   direction=inputs["rope_direction"])


def reference(inputs, dims, mm=torch.matmul):
    return {"qkv": rotate(mm(inputs["a"], inputs["w_qkv"].T), inputs, dims)}
