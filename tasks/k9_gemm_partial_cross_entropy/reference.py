import math

import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    M, d, V = dims["M"], dims["d"], dims["V"]
    # logits with std ~3, as a trained LM head gives
    w = (common.normal((V, d), gen, device, dtype=torch.float32) * (3.0 / math.sqrt(d))).to(dtype)
    return {
        "a": common.normal((M, d), gen, device, dtype=dtype),
        "w_lm": w,
        "targets": common.targets(M, V, gen, device),
    }


def reference(inputs, dims, mm=torch.matmul):
    logits = mm(inputs["a"], inputs["w_lm"].T)
    loss, lse = common.cross_entropy_rows(logits, inputs["targets"])
    return {"loss": loss, "lse": lse}
