import math

import torch

from epiforge.tasks import common

K0, K1 = math.sqrt(2 / math.pi), 0.044715  # gelu_tanh's constants (torch's approximate="tanh")


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    return common.down_projection_backward_inputs(dims, gen, device, "z", 2 * dims["F"], dtype=dtype)


def reference(inputs, dims, mm=torch.matmul):
    g_out = mm(inputs["dout"], inputs["w_down"])
    z = inputs["z"]
    gate, up = z[:, 0::2], z[:, 1::2]
    t = torch.tanh(K0 * (gate + K1 * gate**3))
    gelu = 0.5 * gate * (1 + t)
    dgelu = 0.5 * (1 + t) + 0.5 * gate * (1 - t * t) * K0 * (1 + 3 * K1 * gate * gate)
    dz = torch.stack((g_out * up * dgelu, g_out * gelu), dim=-1).flatten(1)
    return {"dz": dz, "out": gelu * up}
