import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    M, d, F = dims["M"], dims["d"], dims["F"]
    h, rstd = common.deferred_rmsnorm_input(M, d, gen, device, dtype=dtype)
    return {
        "h": h,
        "rstd": rstd,
        "w_gu": common.linear_weight(2 * F, d, gen, device, dtype=dtype),
    }


def reference(inputs, dims, mm=torch.matmul):
    z = inputs["rstd"][:, None] * mm(inputs["h"], inputs["w_gu"].T)
    return {"z": z, "out": common.swiglu_interleaved(z)}
