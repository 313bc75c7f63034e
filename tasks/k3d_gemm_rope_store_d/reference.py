"""k3d: k3's inputs and rotation; the pre-RoPE projection is an output too."""

import torch

from epiforge.tasks.k3_gemm_rope.reference import make_inputs, rotate  # noqa: F401


def reference(inputs, dims, mm=torch.matmul):
    z = mm(inputs["a"], inputs["w_qkv"].T)
    return {"qkv": rotate(z, inputs, dims), "qkv_pre": z}
