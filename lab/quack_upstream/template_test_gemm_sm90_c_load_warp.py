"""GemmSm90.c_load_warp: with the flag, a producer warp that SM90 leaves idle issues the
epilogue's C (and tile-load) TMA loads, ahead of the epilogue and across tile boundaries.
It changes when C arrives, never what is computed, so every output of a GEMM whose
epilogue loads C must be bit-identical with the flag on and off: several shapes (ragged M
and N, CTAs with no tile, several tiles a CTA), pingpong and cooperative, clusters 1x1,
1x2 and 2x1. The combinations the C-load warp does not support raise one-line ValueErrors.

The flag is set through the epilogue frontend: post_init_attrs=(("c_load_warp", True),).
Needs an SM90 GPU (the refusals are raised at trace time, before any launch).
"""

import math

import pytest
import torch

from quack.epilogue.library import (
    dswiglu_dpreact_mod,
    identity_epi,
    residual_epi,
    rms_partial_epi,
    scaled_residual,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="the C-load warp is in the SM90 kernel; needs an SM90 GPU",
)

ON = (("c_load_warp", True),)

# (tile_M, tile_N, cluster_M, cluster_N, pingpong)
CONFIGS = [
    (128, 128, 1, 2, True),
    (128, 128, 1, 1, True),
    (192, 128, 1, 2, True),
    (128, 192, 2, 1, True),
    (128, 128, 2, 1, False),
    (256, 128, 1, 2, False),
    (256, 128, 2, 1, False),
]

# (l, m, n, k); l = 0: unbatched (2-D operands)
SHAPES = [
    (0, 4096, 2048, 512),  # a few tiles a CTA: C is prefetched across tile boundaries
    (0, 1000, 776, 320),  # ragged M and N: partial last tiles
    (0, 136, 200, 64),  # fewer tiles than CTAs: CTAs with no tile, pingpong's tail
    (0, 8192, 4096, 64),  # short K: the epilogue is the critical path
]
BATCHED = (2, 520, 392, 128)  # batched, ragged

EPILOGUES = ["scaled_residual", "rms_partial", "dswiglu_dpreact", "residual_tile"]


def _config_id(cfg):
    tile_m, tile_n, cm, cn, pp = cfg
    return f"{tile_m}x{tile_n}_c{cm}x{cn}_{'pp' if pp else 'coop'}"


def make_call(epilogue, shape, cfg, device="cuda", seed=0):
    """(mod, A, B, D, C, epi_args, outputs): one GEMM call with every buffer it writes,
    outputs prefilled with NaN so a position that one run writes and the other does not
    shows up in the bit comparison."""
    l, m, n, k = shape
    tile_m, tile_n = cfg[:2]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    lead = (l,) if l else ()

    def randn(*s, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*s, generator=gen) * scale).to(dtype=dtype, device=device)

    def out(*s, dtype=torch.bfloat16):
        return torch.full(s, math.nan, dtype=dtype, device=device)

    A = randn(*lead, m, k, scale=4 / math.sqrt(k))
    B = randn(*lead, n, k, scale=4 / math.sqrt(k))
    vec = (l or 1,)
    if epilogue == "scaled_residual":
        mod, C, D = scaled_residual, randn(*lead, m, n), out(*lead, m, n)
        epi_args = dict(alpha=0.75)
        outputs = {"D": D}
    elif epilogue == "rms_partial":
        mod, C, D = rms_partial_epi, randn(*lead, m, n), out(*lead, m, n)
        sqsum_shape = mod.sinks["sqsum"].sink_alloc_shape((*lead, m), n, tile_m, tile_n)
        outputs = {
            "D": D,
            "resid_out": out(*lead, m, n),
            "sqsum": out(*sqsum_shape, dtype=torch.float32),
        }
        epi_args = dict(
            weight=randn(*vec, n, dtype=torch.float32),
            resid_out=outputs["resid_out"],
            sqsum=outputs["sqsum"],
        )
    elif epilogue == "dswiglu_dpreact":
        # packed (x, y) preact pairs: C and D are twice the GEMM's N wide
        mod, C, D = dswiglu_dpreact_mod, randn(*lead, m, 2 * n), out(*lead, m, 2 * n)
        dsum_shape = mod.sinks["dsum"].sink_alloc_shape((*lead, m), n, tile_m, tile_n)
        outputs = {
            "D": D,
            "postact": out(*lead, m, n),
            "dsum": out(*dsum_shape, dtype=torch.float32),
        }
        epi_args = dict(postact=outputs["postact"], dsum=outputs["dsum"])
    elif epilogue == "residual_tile":
        # a full-tile operand and no C: the C-load warp issues the tile loads alone
        mod, C, D = residual_epi, None, out(*lead, m, n)
        epi_args = dict(res=randn(*lead, m, n))
        outputs = {"D": D}
    else:
        raise ValueError(epilogue)
    return mod, A, B, D, C, epi_args, outputs


def run(epilogue, shape, cfg, c_load_warp, device="cuda", launch=True, seed=0, **kwargs):
    """One GEMM call with the flag on or off; returns its outputs (launch=False only
    compiles, which is how a machine without a GPU checks these calls build)."""
    tile_m, tile_n, cluster_m, cluster_n, pingpong = cfg
    mod, A, B, D, C, epi_args, outputs = make_call(epilogue, shape, cfg, device, seed)
    mod.gemm(
        A,
        B,
        D,
        C,
        epi_args=epi_args,
        tile_M=tile_m,
        tile_N=tile_n,
        cluster_M=cluster_m,
        cluster_N=cluster_n,
        pingpong=pingpong,
        post_init_attrs=ON if c_load_warp else (),
        _launch=launch,
        **kwargs,
    )
    return outputs


def _bits(t):
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def assert_same_bits(got, want, what):
    assert got.keys() == want.keys()
    for name in want:
        same = torch.equal(_bits(got[name]), _bits(want[name]))
        differ = (_bits(got[name]) != _bits(want[name])).sum().item()
        assert same, f"{what}: {name} differs with c_load_warp on ({differ} values)"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("cfg", CONFIGS, ids=_config_id)
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_c_load_warp_same_bits(epilogue, cfg, shape):
    off = run(epilogue, shape, cfg, False)
    torch.cuda.synchronize()
    for rep in range(3):  # a stage reused too early shows up as a difference, maybe not every time
        on = run(epilogue, shape, cfg, True, seed=0)
        torch.cuda.synchronize()
        assert_same_bits(on, off, f"{epilogue} {_config_id(cfg)} {shape} call {rep}")


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[-1]], ids=_config_id)
@pytest.mark.parametrize("epilogue", ["scaled_residual", "rms_partial"])
def test_c_load_warp_same_bits_batched(epilogue, cfg):
    off = run(epilogue, BATCHED, cfg, False)
    on = run(epilogue, BATCHED, cfg, True)
    assert_same_bits(on, off, f"{epilogue} {_config_id(cfg)} {BATCHED}")


def test_c_load_warp_computes_the_gemm():
    """The flag-on result is the GEMM's, not only the flag-off kernel's bits."""
    shape, cfg = (0, 1000, 776, 320), CONFIGS[0]
    mod, A, B, D, C, epi_args, _ = make_call("scaled_residual", shape, cfg)
    got = run("scaled_residual", shape, cfg, True)["D"].float()
    want = 0.75 * (A.float() @ B.float().mT) + C.float()
    assert (got - want).abs().max().item() < 2e-2 * want.abs().max().item()


@pytest.mark.parametrize("epilogue", ["scaled_residual", "rms_partial"])
def test_c_load_warp_same_bits_other_schedulers(epilogue):
    """Not the static persistent scheduler: one tile a CTA (persistent=False), and the
    dynamic persistent scheduler (tiles handed out through a semaphore)."""
    shape = (0, 1000, 776, 320)
    coop = (128, 128, 2, 1, False)
    off = run(epilogue, shape, coop, False, persistent=False)
    on = run(epilogue, shape, coop, True, persistent=False)
    assert_same_bits(on, off, f"{epilogue} persistent=False")
    for cfg in (coop, CONFIGS[0]):
        runs = []
        for flag in (False, True):
            sem = torch.zeros(1, dtype=torch.int32, device="cuda")
            kw = dict(is_dynamic_persistent=True, tile_count_semaphore=sem)
            runs.append(run(epilogue, shape, cfg, flag, **kw))
        assert_same_bits(runs[1], runs[0], f"{epilogue} dynamic persistent {_config_id(cfg)}")


def refused_calls(device="cuda", launch=True):
    """{what: a call that must raise ValueError("c_load_warp: ...")}."""
    m, n, k = 300, 520, 256
    A = torch.randn(m, k, device=device).to(torch.bfloat16)
    B = torch.randn(n, k, device=device).to(torch.bfloat16)
    C = torch.randn(m, n, device=device).to(torch.bfloat16)
    D = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    B3 = B.unsqueeze(0).expand(2, -1, -1)
    cu_seqlens_m = torch.tensor([0, 100, m], dtype=torch.int32, device=device)
    kw = dict(tile_M=128, tile_N=128, cluster_M=1, cluster_N=1, post_init_attrs=ON, _launch=launch)
    res = dict(epi_args=dict(alpha=0.5))
    return {
        "loads no C": lambda: identity_epi.gemm(A, B, D, epi_args={}, pingpong=True, **kw),
        "split_k": lambda: scaled_residual.gemm(A, B, D, C, split_k=2, **res, **kw),
        "varlen_m": lambda: scaled_residual.gemm(
            A, B3, D, C, cu_seqlens_m=cu_seqlens_m, **res, **kw
        ),
        "gather_A": lambda: scaled_residual.gemm(
            A, B3, D, C, cu_seqlens_m=cu_seqlens_m,
            A_idx=torch.arange(m, dtype=torch.int32, device=device), **res, **kw,
        ),
    }


REFUSALS = {
    "loads no C": "c_load_warp: this GEMM loads no C and no epilogue tile",
    "split_k": "c_load_warp: split_k > 1 is not supported",
    "varlen_m": "c_load_warp: varlen_m / varlen_k are not supported",
    "gather_A": "c_load_warp: gather_A takes every producer warp",
}


@pytest.mark.parametrize("what", list(REFUSALS))
def test_c_load_warp_refusals(what):
    with pytest.raises(ValueError, match=REFUSALS[what]) as info:
        refused_calls()[what]()
    assert len(str(info.value).splitlines()) == 1
