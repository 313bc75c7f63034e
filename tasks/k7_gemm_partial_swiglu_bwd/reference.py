import torch

from epiforge.tasks import common


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    return common.down_projection_backward_inputs(dims, gen, device, "z", 2 * dims["F"], dtype=dtype)


def reference(inputs, dims, mm=torch.matmul):
    g_out = mm(inputs["dout"], inputs["w_down"])
    z = inputs["z"]
    gate, up = z[:, 0::2], z[:, 1::2]
    s = torch.sigmoid(gate)
    d_gate = g_out * up * s * (1 + gate * (1 - s))
    d_up = g_out * gate * s
    dz = torch.stack((d_gate, d_up), dim=-1).flatten(1)
    return {"dz": dz, "out": gate * s * up, "zdz": (z * dz).sum(-1)}
