import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device):
    M, d, F = dims["M"], dims["d"], dims["F"]
    return {"a": common.normal((M, d), gen, device), "w_gu": common.linear_weight(2 * F, d, gen, device)}


def reference(inputs, dims, mm=torch.matmul):
    z = mm(inputs["a"], inputs["w_gu"].T)
    return {"z": z, "out": common.swiglu_interleaved(z)}
