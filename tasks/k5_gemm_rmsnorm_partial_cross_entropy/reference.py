import math

import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    M, d, V = dims["M"], dims["d"], dims["V"]
    h, rstd = common.deferred_rmsnorm_input(M, d, gen, device, dtype=dtype)
    w = (common.normal((V, d), gen, device, dtype=torch.float32) * (3.0 / math.sqrt(d))).to(dtype)
    return {
        "h": h,
        "rstd": rstd,
        "w_lm": w,
        "targets": common.targets(M, V, gen, device),
    }


def reference(inputs, dims, mm=torch.matmul):
    logits = inputs["rstd"][:, None] * mm(inputs["h"], inputs["w_lm"].T)
    loss, lse = common.cross_entropy_rows(logits, inputs["targets"])
    return {"loss": loss, "lse": lse}
