import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device):
    M, d = dims["M"], dims["d"]
    h, rstd = common.deferred_rmsnorm_input(M, d, gen, device)
    return {
        "h": h,
        "rstd": rstd,
        "w": common.linear_weight(3 * d, d, gen, device),
    }


def reference(inputs, dims, mm=torch.matmul):
    return {"out": inputs["rstd"][:, None] * mm(inputs["h"], inputs["w"].T)}
