"""P.HeadRMS: a per-(row, head) RMS statistic computed inside the kernel (quack's HeadRstd
prepass), which makes Qwen3's QK-norm one fused epilogue: in the emulator against torch,
its declaration and call errors, the static checks, the sm_90a cross-compile, and (marker
`gpu`) on the H200 against the emulator."""

from __future__ import annotations


import pytest
import torch

from epiforge import primitives as P
from epiforge.eval.static_checks import check_source

KERNEL = '''
import primitives as P


@P.epilogue(operands={"rstd": P.HeadRMS(head_dim=64, eps=1e-6), "w": P.PerCol()})
def head_norm(acc, rstd, w):
    return {"D": acc * rstd * w}


@P.epilogue(operands={"rstd": P.HeadRMS(head_dim=64), "w": P.PerCol(), "pos": P.PerRow(), "freq": P.PerCol()},
            mode="acc_pair")
def head_norm_rope(acc, rstd, w, pos, freq):
    x1, x2 = P.unpack(acc * rstd * w)
    return {"D": P.pack(*P.rope_rotate(x1, x2, pos, freq))}
'''


def _kernels():
    scope = {}
    exec(compile(KERNEL, "head_norm.py", "exec"), scope)
    return scope["head_norm"], scope["head_norm_rope"]


def _inputs(m=150, n=256, k=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen).bfloat16()
    w = (torch.randn(n, k, generator=gen) / 8).bfloat16()
    weight = torch.rand(n, generator=gen) + 0.5
    return a, w, weight


def _head_norm(z, head_dim, eps, weight):
    heads = z.reshape(z.shape[0], -1, head_dim)
    return (heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + eps)).reshape(z.shape) * weight


def test_head_rms_normalizes_each_head_as_torch_does():
    head_norm, _ = _kernels()
    a, w, weight = _inputs()
    z = a.float() @ w.float().T
    out = head_norm(a, w, w=weight, dtypes={"D": torch.float32}, config=P.GemmConfig(tile_n=128))
    assert torch.allclose(out["D"], _head_norm(z, 64, 1e-6, weight), rtol=1e-5, atol=1e-6)
    # each head's statistic is its own: scaling one head's weight rows leaves the others alone
    w2 = w.clone()
    w2[:64] *= 4
    out2 = head_norm(a, w2, w=weight, dtypes={"D": torch.float32}, config=P.GemmConfig(tile_n=128))
    assert torch.allclose(out2["D"][:, 64:], out["D"][:, 64:]) and not torch.allclose(out2["D"][:, :64], 4 * out["D"][:, :64])


def test_head_rms_then_rope_in_pair_mode_matches_torch():
    _, head_norm_rope = _kernels()
    a, w, weight = _inputs()
    from epiforge.tasks.common import rope_interleaved

    inv_freq = 1.0 / 10000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    table = P.prepare.rope_freq_table(inv_freq.float(), 64, rotary_cols=256)
    pos = torch.arange(150, dtype=torch.float32)
    out = head_norm_rope(a, w, w=weight, pos=pos, freq=table, dtypes={"D": torch.float32},
                         config=P.GemmConfig(tile_n=128))
    want = rope_interleaved(_head_norm(a.double() @ w.double().T, 64, 1e-6, weight.double()), pos.double(),
                            inv_freq, 256)
    assert torch.allclose(out["D"].double(), want, rtol=1e-4, atol=1e-5)


def test_head_rms_declarations_and_calls_that_cannot_work_are_refused():
    head_norm, _ = _kernels()
    a, w, weight = _inputs()
    with pytest.raises(P.EpilogueError, match="tile_n must be whole heads"):
        head_norm(a, w, w=weight, config=P.GemmConfig(tile_n=160))
    with pytest.raises(P.EpilogueError, match="computed in the kernel"):
        head_norm(a, w, w=weight, rstd=torch.ones(150), config=P.GemmConfig(tile_n=128))
    a2, w2, weight2 = _inputs(n=200)
    with pytest.raises(P.EpilogueError, match="whole heads"):
        head_norm(a2, w2, w=weight2, config=P.GemmConfig(tile_n=128))
    with pytest.raises(ValueError, match="head_dim"):
        P.HeadRMS(head_dim=60)
    with pytest.raises(P.EpilogueError, match="at most one HeadRMS"):
        P.epilogue(operands={"r": P.HeadRMS(64), "s": P.HeadRMS(64)})(lambda acc, r, s: {"D": acc * r * s})


def test_the_static_checks_accept_head_rms():
    source = KERNEL + '''

def run(inputs, prepared, config=None):
    return {"out": head_norm(inputs["a"], inputs["w"], w=inputs["g"], config=config)["D"]}
'''
    assert check_source(source) == []


CALLS = """
a, w, g = torch.randn(256, 64).bfloat16(), torch.randn(256, 64).bfloat16(), torch.rand(256)
table = P.prepare.rope_freq_table(torch.rand(32), 64, rotary_cols=256)
cfg = P.GemmConfig(tile_n=128)
head_norm(a, w, w=g, config=cfg)
head_norm_rope(a, w, w=g, pos=torch.arange(256.0), freq=table, config=cfg)
"""


@pytest.mark.spawns
def test_head_rms_cross_compiles_for_sm90a(sm90a_compile_log):
    log = sm90a_compile_log(KERNEL, CALLS)
    assert [(e["epilogue"], e["ok"]) for e in log] == [("head_norm", True), ("head_norm_rope", True)]


@pytest.mark.gpu
def test_head_rms_on_the_gpu_matches_the_emulator():
    head_norm, head_norm_rope = _kernels()
    a, w, weight = _inputs(m=300, n=512, k=128, seed=2)
    cfg = P.GemmConfig(tile_n=128)
    cpu = head_norm(a, w, w=weight, dtypes={"D": torch.float32}, config=cfg)["D"]
    gpu = head_norm(a.cuda(), w.cuda(), w=weight.cuda(), dtypes={"D": torch.float32}, config=cfg)["D"].cpu()
    assert torch.allclose(gpu, cpu, rtol=1e-4, atol=1e-4)
    table = P.prepare.rope_freq_table(torch.rand(32), 64, rotary_cols=512)
    pos = torch.arange(300.0)
    cpu = head_norm_rope(a, w, w=weight, pos=pos, freq=table, dtypes={"D": torch.float32}, config=cfg)["D"]
    gpu = head_norm_rope(a.cuda(), w.cuda(), w=weight.cuda(), pos=pos.cuda(), freq=table.cuda(),
                         dtypes={"D": torch.float32}, config=cfg)["D"].cpu()
    assert torch.allclose(gpu, cpu, rtol=1e-4, atol=1e-3)
