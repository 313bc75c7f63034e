import torch

from epiforge.tasks import common
from epiforge.tasks.k3_gemm_rope.reference import rotate


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    M, d = dims["M"], dims["d"]
    h, rstd = common.deferred_rmsnorm_input(M, d, gen, device, dtype=dtype)
    return {
        "h": h,
        "rstd": rstd,
        "w_qkv": common.linear_weight(3 * d, d, gen, device, dtype=dtype),
        "positions": common.positions(M, dims["seq"], device),
        "inv_freq": common.rope_inv_freq(dims["head_dim"], device),
    }


def reference(inputs, dims, mm=torch.matmul):
    return {"qkv": rotate(inputs["rstd"][:, None] * mm(inputs["h"], inputs["w_qkv"].T), inputs, dims)}
