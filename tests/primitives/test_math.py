"""The piecewise and transcendental math of primitives/math.py (relu, max, min, abs, where,
tanh, erf, gelu, gelu_tanh, squared_relu): each against torch's own function in the
emulator (edge values included), inside an epilogue through the emulator, through the
static checks, cross-compiled for sm_90a, and (marker `gpu`) on the H200 against the
emulator."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
import torch.nn.functional as F

from epiforge import primitives as P
from epiforge.eval.static_checks import check_source

EDGES = torch.tensor([-math.inf, -30.0, -2.5, -1.0, -1e-30, -0.0, 0.0, 1e-30, 0.5, 1.0, 3.0, 30.0, math.inf, math.nan])


def same(got, want) -> bool:
    """Equal element by element up to float32 rounding, NaN where NaN."""
    return bool(torch.allclose(got, want, rtol=2e-6, atol=1e-7, equal_nan=True))


@pytest.mark.parametrize("name,ours,theirs", [
    ("relu", P.relu, torch.relu),
    ("abs", P.abs, torch.abs),
    ("tanh", P.tanh, torch.tanh),
    ("erf", P.erf, torch.erf),
    ("erfc", P.erfc, torch.erfc),
    ("squared_relu", P.squared_relu, lambda x: torch.relu(x) ** 2),
    # the GELUs by their definitions in float64; torch's own float32 GELUs lose the negative
    # tail to cancellation (1 + erf, 1 + tanh) and give NaN at +inf, so they are compared
    # below only where that does not bite
    ("gelu", P.gelu, lambda x: (0.5 * x.double() * torch.erfc(-x.double() / math.sqrt(2))).float()),
    ("gelu_tanh", P.gelu_tanh, lambda x: (x.double() * torch.sigmoid(
        2 * math.sqrt(2 / math.pi) * (x.double() + 0.044715 * x.double() ** 3))).float()),
])
def test_unary_math_is_torchs_on_edge_values(name, ours, theirs):
    x = torch.cat([EDGES, torch.randn(1000) * 4])
    assert same(ours(x), theirs(x)), name


def test_the_gelus_are_torchs_where_torch_keeps_its_digits():
    x = torch.linspace(-3, 30, 20001)
    assert torch.allclose(P.gelu(x), F.gelu(x), rtol=1e-5, atol=1e-6)
    assert torch.allclose(P.gelu_tanh(x), F.gelu(x, approximate="tanh"), rtol=1e-5, atol=1e-6)
    tail = torch.tensor([-9.0, -6.0])  # where torch's float32 erf form has lost most digits
    exact = 0.5 * tail.double() * torch.erfc(-tail.double() / math.sqrt(2))
    assert torch.allclose(P.gelu(tail).double(), exact, rtol=1e-5)


def test_relu_keeps_nan_as_torch_does():
    # a maxNum relu (quack's, NaN -> 0) would differ from torch here; ours propagates
    assert math.isnan(P.relu(torch.tensor([math.nan])).item())
    assert math.isnan(P.max(torch.tensor([math.nan]), 1.0).item())


def test_max_min_take_values_and_numbers_in_either_place():
    x, y = torch.randn(100), torch.randn(100)
    assert torch.equal(P.max(x, y), torch.maximum(x, y)) and torch.equal(P.min(x, y), torch.minimum(x, y))
    assert torch.equal(P.max(x, 0.25), x.clamp_min(0.25)) and torch.equal(P.min(0.25, x), x.clamp_max(0.25))
    assert P.max(2.0, 3.0).item() == 3.0 and P.min(2, -1).item() == -1.0


def test_where_selects_on_a_comparison_and_refuses_a_value_as_condition():
    x = torch.randn(100)
    assert torch.equal(P.where(x > 0, x, 0.0), torch.relu(x))
    assert torch.equal(P.where(x <= 0.5, 1.0, x), torch.where(x <= 0.5, torch.ones(()), x))
    with pytest.raises(TypeError, match="comparison"):
        P.where(x, x, 0.0)


KERNEL = '''
import torch
import primitives as P


@P.epilogue(outputs=("act", "gate"), operands={"t": P.PerCol()})
def new_math(acc, t):
    clipped = P.min(P.max(acc, -2.0), t)
    sel = P.where(acc > t, P.abs(acc), P.squared_relu(acc))
    return {"D": P.gelu(acc) + P.gelu_tanh(clipped), "act": P.tanh(acc) * P.erf(sel) + P.relu(acc),
            "gate": sel}
'''


def _reference(a, w, t):
    acc = a.float() @ w.float().T
    clipped = torch.minimum(torch.maximum(acc, torch.tensor(-2.0)), t)
    sel = torch.where(acc > t, acc.abs(), torch.relu(acc) ** 2)
    return {"D": F.gelu(acc) + F.gelu(clipped, approximate="tanh"),
            "act": torch.tanh(acc) * torch.erf(sel) + torch.relu(acc), "gate": sel}


def test_the_new_math_inside_an_epilogue_matches_torch_in_the_emulator():
    scope = {}
    exec(compile(KERNEL, "new_math.py", "exec"), scope)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(200, 64, generator=gen).bfloat16()
    w = (torch.randn(96, 64, generator=gen) / 8).bfloat16()
    t = torch.randn(96, generator=gen)
    out = scope["new_math"](a, w, t=t, dtypes={"D": torch.float32, "act": torch.float32, "gate": torch.float32})
    want = _reference(a, w, t)
    for name in ("D", "act", "gate"):
        assert torch.allclose(out[name], want[name], rtol=1e-5, atol=1e-5), name


def test_the_static_checks_accept_the_new_math_in_an_epilogue_body():
    source = KERNEL + textwrap.dedent('''
        def run(inputs, prepared, config=None):
            return {"out": new_math(inputs["a"], inputs["w"], t=inputs["t"], config=config)["D"]}
    ''')
    assert check_source(source) == []


@pytest.mark.spawns
def test_the_new_math_cross_compiles_for_sm90a(sm90a_compile_log):
    log = sm90a_compile_log(KERNEL, "a, w, t = torch.randn(256, 64).bfloat16(), torch.randn(192, 64).bfloat16(), "
                                    "torch.randn(192)\nnew_math(a, w, t=t)\n")
    assert [e["ok"] for e in log] == [True] and log[0]["epilogue"] == "new_math"


@pytest.mark.gpu
def test_the_new_math_on_the_gpu_matches_the_emulator():
    scope = {}
    exec(compile(KERNEL, "new_math.py", "exec"), scope)
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(300, 128, generator=gen).bfloat16()
    w = (torch.randn(200, 128, generator=gen) / 8).bfloat16()
    t = torch.randn(200, generator=gen)
    dt = {"D": torch.float32, "act": torch.float32, "gate": torch.float32}
    cpu = scope["new_math"](a, w, t=t, dtypes=dt)
    gpu = scope["new_math"](a.cuda(), w.cuda(), t=t.cuda(), dtypes=dt)
    for name in ("D", "act", "gate"):
        # the GEMM's float32 accumulation order differs (tensor cores); the math itself is
        # the precise instruction sequence (tanh, erf), so the outputs agree to ~1e-5
        assert torch.allclose(gpu[name].cpu(), cpu[name], rtol=1e-4, atol=1e-4), name
