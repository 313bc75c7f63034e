"""k4d: k4's inputs and rotation; the normalized pre-RoPE projection is an output too."""

import torch

from epiforge.tasks.k3_gemm_rope.reference import rotate
from epiforge.tasks.k4_gemm_rmsnorm_rope.reference import make_inputs  # noqa: F401


def reference(inputs, dims, mm=torch.matmul):
    z = inputs["rstd"][:, None] * mm(inputs["h"], inputs["w_qkv"].T)
    return {"qkv": rotate(z, inputs, dims), "qkv_pre": z}
