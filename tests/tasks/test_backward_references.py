"""The backward tasks' references are the gradients torch.autograd takes of their forward,
in float64: k7 (down-projection dgrad + SwiGLU backward + ZdZ) and k6 (gate/up dgrad +
RMSNorm backward + the residual gradient), on the tasks' own inputs at a smoke shape."""

from __future__ import annotations

import torch

from epiforge import tasks
from epiforge.tasks.common import swiglu_interleaved

DIMS = tasks.shape_sets()["smoke"][0].dims()


def _double(inputs: dict) -> dict:
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}


def test_k7_reference_is_autograd_of_the_swiglu_and_down_projection():
    task = tasks.get_task("k7")
    inputs = _double(task.make_inputs(DIMS, seed=4))
    ref = task.reference(inputs, DIMS, exact=True)
    z = inputs["z"].clone().requires_grad_()
    out = swiglu_interleaved(z)
    y = out @ inputs["w_down"].T  # the MLP's output: (M, F) @ (F, d)
    y.backward(inputs["dout"])
    assert torch.allclose(ref["dz"], z.grad, rtol=1e-10, atol=1e-14)
    assert torch.allclose(ref["out"], out.detach(), rtol=1e-12, atol=1e-14)
    assert torch.allclose(ref["zdz"], (inputs["z"] * z.grad).sum(-1), rtol=1e-10, atol=1e-14)


def test_k6_reference_is_autograd_of_the_rmsnorm_gate_up_projection_and_residual():
    task = tasks.get_task("k6")
    inputs = _double(task.make_inputs(DIMS, seed=4))
    eps = 1e-6  # the task's: its make_inputs computes rstd with it
    x = inputs["x"].clone().requires_grad_()
    w = inputs["norm_weight"].clone().requires_grad_()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    h = x * rstd * w
    z = h @ inputs["w_gu"].T  # (M, d) @ (d, 2F)
    # the residual stream x feeds the norm and the residual; dz arrives at z, dx_in along the residual
    ((z * inputs["dz"]).sum() + (x * inputs["dx_in"]).sum()).backward()
    # the reference takes rstd and ZdZ as saved by the forward and by k7: give it this graph's own
    given = {**inputs, "rstd": rstd.detach()[:, 0], "zdz": (z.detach() * inputs["dz"]).sum(-1)}
    ref = task.reference(given, DIMS, exact=True)
    assert torch.allclose(ref["dx"], x.grad, rtol=1e-9, atol=1e-13)
    assert torch.allclose(ref["dw"], w.grad, rtol=1e-9, atol=1e-12)
    assert torch.allclose(ref["h"], h.detach(), rtol=1e-12, atol=1e-14)
