import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    return common.down_projection_backward_inputs(dims, gen, device, "h", dims["F"], dtype=dtype)


def reference(inputs, dims, mm=torch.matmul):
    g_act = mm(inputs["dout"], inputs["w_down"])
    relu_h = torch.relu(inputs["h"])
    dh = g_act * 2 * relu_h
    return {"dh": dh, "act": relu_h * relu_h, "db_up": common.at_least_float32(dh).sum(0)}
