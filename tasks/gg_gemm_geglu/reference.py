import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    M, d, F = dims["M"], dims["d"], dims["F"]
    return {"a": common.normal((M, d), gen, device, dtype=dtype), "w_gu": common.linear_weight(2 * F, d, gen, device, dtype=dtype)}


def reference(inputs, dims, mm=torch.matmul):
    z = mm(inputs["a"], inputs["w_gu"].T)
    gate, up = z[:, 0::2], z[:, 1::2]
    return {"z": z, "out": torch.nn.functional.gelu(gate, approximate="tanh") * up}
