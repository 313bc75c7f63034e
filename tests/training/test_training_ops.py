"""training/ops.py: the fused SwiGLU MLP as a torch custom op with autograd, checked on the
CPU (the expert kernels k8 and k7 through the emulator) against an unfused float64 model,
by torch.library.opcheck, and under torch.compile(fullgraph=True)."""

import pytest
import torch

from epiforge.training.ops import swiglu_mlp

#: bf16 operands and outputs: every gradient within 1% of its largest element of float64's
REL_TOL = 1e-2


def _params(M=96, d=128, F=256, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, d, generator=g).bfloat16()
    w_gu = (torch.randn(2 * F, d, generator=g) / d**0.5).bfloat16()
    w_down = (torch.randn(d, F, generator=g) / F**0.5).bfloat16()
    return [t.to(device).requires_grad_() for t in (a, w_gu, w_down)]


def _unfused(a, w_gu, w_down):
    z = a @ w_gu.T
    gate, up = z[:, 0::2], z[:, 1::2]  # interleaved rows: 2j gate, 2j+1 up
    return (torch.nn.functional.silu(gate) * up) @ w_down.T


def _loss(y):
    return y.float().pow(2).mean()


def _grads_against_float64(device):
    params = _params(device=device)
    y, z = swiglu_mlp(*params)
    _loss(y).backward()
    ref = [p.detach().double().requires_grad_() for p in params]
    y64 = _unfused(*ref)
    _loss(y64).backward()
    assert z.shape == (params[0].shape[0], params[1].shape[0])
    for name, got, want in (("y", y, y64), *zip(("da", "dw_gu", "dw_down"), (p.grad for p in params),
                                                   (r.grad for r in ref))):
        err = (got.double() - want).abs().max() / want.abs().max()
        assert err < REL_TOL, f"{name}: {err:.2e} of its largest element off float64"


def test_gradients_match_an_unfused_float64_mlp_on_the_cpu():
    _grads_against_float64("cpu")


def test_the_op_passes_torch_library_opcheck():
    """Its schema, autograd registration and fake (meta) implementation, as torch checks them."""
    result = torch.library.opcheck(swiglu_mlp, tuple(_params(M=64)), test_utils=(
        "test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_it_traces_whole_under_torch_compile_and_gives_the_eager_numbers():
    params = _params(M=64)

    def step(a, w_gu, w_down):
        return _loss(swiglu_mlp(a, w_gu, w_down)[0])

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(*params)
    loss.backward()
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    eager = step(*params)
    eager.backward()
    assert loss.item() == eager.item() and all(torch.equal(g, p.grad) for g, p in zip(grads, params))


def test_operands_that_do_not_fit_are_one_line():
    a, w_gu, w_down = _params(M=32)
    with pytest.raises(ValueError, match="do not fit"):
        swiglu_mlp(a, w_gu, w_down[:, :-8])
    with pytest.raises(ValueError, match="bfloat16"):
        swiglu_mlp(a.float(), w_gu.float(), w_down.float())


@pytest.mark.gpu
def test_gradients_match_an_unfused_float64_mlp_on_the_gpu():
    _grads_against_float64("cuda")
