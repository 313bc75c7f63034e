import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    M, d, F = dims["M"], dims["d"], dims["F"]
    return {
        "dout": common.normal((M, d), gen, device, std=1e-2, dtype=dtype),
        "w_down": common.linear_weight(d, F, gen, device, dtype=dtype),
        "h": common.normal((M, F), gen, device, dtype=dtype),
    }


def reference(inputs, dims, mm=torch.matmul):
    g_act = mm(inputs["dout"], inputs["w_down"])
    relu_h = torch.relu(inputs["h"])
    dh = g_act * 2 * relu_h
    return {"dh": dh, "act": relu_h * relu_h, "db_up": common.at_least_float32(dh).sum(0)}
