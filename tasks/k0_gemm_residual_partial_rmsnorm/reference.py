import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    M, d = dims["M"], dims["d"]
    return {
        "a": common.normal((M, d), gen, device, dtype=dtype),
        "w_o": common.linear_weight(d, d, gen, device, dtype=dtype),
        "residual": common.normal((M, d), gen, device, dtype=dtype),
        "norm_weight": common.norm_weight(d, gen, device, dtype=dtype),
    }


def reference(inputs, dims, mm=torch.matmul):
    x = mm(inputs["a"], inputs["w_o"].T) + inputs["residual"]
    h = x * inputs["norm_weight"]
    rstd = (x * x).mean(-1).add(inputs["eps"]).rsqrt()
    return {"x": x, "h": h, "rstd": rstd}
