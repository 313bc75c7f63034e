import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device):
    M, d, F = dims["M"], dims["d"], dims["F"]
    h, rstd = common.deferred_rmsnorm_input(M, d, gen, device)
    return {
        "h": h,
        "rstd": rstd,
        "w_gu": common.linear_weight(2 * F, d, gen, device),
    }


def reference(inputs, dims, mm=torch.matmul):
    z = inputs["rstd"][:, None] * mm(inputs["h"], inputs["w_gu"].T)
    return {"z": z, "out": common.swiglu_interleaved(z)}
