"""quack's own library epilogues (CODA's authors) run through the contract's emulator via
their torch twins and agree with plain torch."""

import pytest
import torch

from epiforge import primitives as P
from epiforge.primitives.config import GemmConfig

gen = torch.Generator().manual_seed(1)
M, N, K = 200, 384, 64
A = torch.randn(M, K, generator=gen).bfloat16()
W = (torch.randn(N, K, generator=gen) / 8).bfloat16()
ACC = A.float() @ W.float().T


@pytest.fixture(scope="module")
def lib():
    from quack.epilogue import library

    return library


def test_rms_partial(lib):
    epi = P.from_quack(lib.rms_partial_epi)
    assert epi.mode == "element" and epi.outputs == ("resid_out",)
    assert isinstance(epi.operands["weight"], P.PerCol) and epi.reductions["sqsum"] == P.RowReduce(product=True)
    c, w = torch.randn(M, N, generator=gen).bfloat16(), torch.randn(N, generator=gen).bfloat16()
    out = epi(A, W, c=c, weight=w, config=GemmConfig(tile_n=128))
    y = ACC + c.float()
    assert torch.equal(out["resid_out"], y.bfloat16()) and torch.equal(out["D"], (y * w.float()).bfloat16())
    assert torch.allclose(out["sqsum"], (y * y).view(M, 3, 128).sum(-1), rtol=1e-5)


def test_swiglu_and_its_backward(lib):
    out = P.from_quack(lib.swiglu_mod)(A, W)
    g, u = ACC[:, 0::2], ACC[:, 1::2]
    assert torch.equal(out["D"], ACC.bfloat16())
    assert torch.allclose(out["postact"].float(), (torch.nn.functional.silu(g) * u).bfloat16().float(), atol=1e-2)

    z = torch.randn(M, 2 * N, generator=gen).bfloat16()
    bwd = P.from_quack(lib.dswiglu_dpreact_mod)
    assert bwd.mode == "packed_pair"
    out = bwd(A, W, c=z)
    zg, zu = z.float()[:, 0::2], z.float()[:, 1::2]
    s = torch.sigmoid(zg)
    dg, du = ACC * zu * s * (1 + zg * (1 - s)), ACC * zg * s
    assert torch.allclose(out["D"][:, 0::2].float(), dg, atol=2e-2, rtol=1e-2)
    assert torch.allclose(out["dsum"].sum(1), (zg * dg + zu * du).sum(1), rtol=1e-4, atol=1e-3)


def test_lse_target(lib):
    tgt = torch.randint(0, N, (M,), generator=gen)
    epi = P.from_quack(lib.lse_target_epi)
    assert epi.reductions["target_logit"] == P.RowSelect(index="target")
    out = epi(A, W, target=tgt, store_d=False)
    assert torch.allclose(torch.logsumexp(out["lse"], 1), torch.logsumexp(ACC, 1), rtol=1e-6)
    assert torch.equal(out["target_logit"], ACC.gather(1, tgt[:, None])[:, 0])


def test_rope_posfreq_twin_follows_quack_angle_math():
    from quack.epilogue.rotary import rope_posfreq_epi

    inv_freq = (1.0 / 10000 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)).float()
    table = P.prepare.rope_freq_table(inv_freq, 128, rotary_cols=256, passthrough_cols=128)
    pos = torch.arange(M, dtype=torch.float32) * 40
    out = P.from_quack(rope_posfreq_epi)(A, W, pos=pos, freq=table, dtypes={"D": torch.float32})
    acc = A.double() @ W.double().T
    ang = pos.double()[:, None] * inv_freq.double()
    x1, x2 = acc[:, 0:256:2].reshape(M, 2, 64), acc[:, 1:256:2].reshape(M, 2, 64)
    ref = x1 * torch.cos(ang)[:, None] - x2 * torch.sin(ang)[:, None]
    assert (out["D"][:, 0:256:2].double().reshape(M, 2, 64) - ref).abs().max() < 1e-4
    assert torch.equal(out["D"][:, 256:], ACC[:, 256:])


def test_helpers_that_reach_each_other_twin_without_recursing(lib):
    # dgelu_mod's activation helpers reference one another (a cycle through globals)
    c = torch.randn(M, N, generator=gen).bfloat16()
    out = P.from_quack(lib.dgelu_mod)(A, W, c=c)
    x = c.float()
    gelu = 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x**3)))
    assert torch.allclose(out["postact"].float(), gelu, atol=2e-2, rtol=1e-2)


def test_dsl_ops_twinned_through_their_wrappers(lib):
    out = P.from_quack(lib.relu_sq_mod)(A, W)
    ref = torch.relu(ACC) ** 2
    assert ((out["postact"].float() - ref).abs() <= 1e-2 * ref.abs() + 1e-3).all()
    with pytest.raises(P.EpilogueError, match="arith.*no torch twin"):
        P.from_quack(lib.dswiglu_oai_moe_mod)(A, W[:128], c=torch.randn(M, 256).bfloat16(), score=torch.rand(M))


def test_unsupported_library_epilogue_is_one_clear_error(lib):
    with pytest.raises(P.EpilogueError, match="quantized"):
        P.from_quack(lib.swiglu_quant_mod)
    with pytest.raises(P.EpilogueError, match="prepass|no torch meaning"):
        P.from_quack(lib.head_rmsnorm_epi)
    with pytest.raises(P.EpilogueError, match="does not exist"):
        P.from_quack("quack.epilogue.library:no_such_epi").resolve()
