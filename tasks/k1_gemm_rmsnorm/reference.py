import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    M, d = dims["M"], dims["d"]
    h, rstd = common.deferred_rmsnorm_input(M, d, gen, device, dtype=dtype)
    return {
        "h": h,
        "rstd": rstd,
        "w": common.linear_weight(3 * d, d, gen, device, dtype=dtype),
    }


def reference(inputs, dims, mm=torch.matmul):
    return {"out": inputs["rstd"][:, None] * mm(inputs["h"], inputs["w"].T)}
