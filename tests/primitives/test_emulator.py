"""The CPU meaning of the epilogue contract, checked against plain torch."""

import math
import subprocess
import sys

import pytest
import torch

from epiforge import primitives as P
from epiforge.primitives.config import GemmConfig

gen = torch.Generator().manual_seed(0)


def rnd(*shape, dtype=torch.bfloat16, std=1.0):
    return (torch.randn(shape, generator=gen) * std).to(dtype)


M, N, K = 300, 200, 64  # neither M nor N is a multiple of the tiles: ragged last tiles
A, W = rnd(M, K), rnd(N, K, std=0.125)
ACC = A.float() @ W.float().T


def tiles(x, size, dim):
    """Split along dim into tiles of `size` (last one ragged)."""
    return torch.split(x, size, dim=dim)


def test_element_mode_operands_outputs_and_row_reductions():
    c, row, col, tile = rnd(M, N), rnd(M, dtype=torch.float32), rnd(N), rnd(M, N)

    @P.epilogue(
        outputs=("y",),
        operands={"r": P.PerRow(), "w": P.PerCol(), "t": P.Tile(), "s": P.Scalar()},
        reductions={"sq": P.RowReduce(product=True), "mx": P.RowReduce("max"), "amx": P.RowReduce("absmax")},
    )
    def epi(acc, c, r, w, t, s):
        y = (acc + c) * r
        return {"D": y * w + t * s, "y": y, "sq": (y, y), "mx": y, "amx": y}

    cfg = GemmConfig(tile_m=128, tile_n=64)
    out = epi(A, W, c=c, r=row, w=col, t=tile, s=0.5, config=cfg)
    y = (ACC + c.float()) * row[:, None]
    assert torch.equal(out["y"], y.bfloat16())
    assert torch.equal(out["D"], (y * col.float() + tile.float() * 0.5).bfloat16())
    assert out["sq"].shape == (M, math.ceil(N / 64)) and out["sq"].dtype == torch.float32
    for j, part in enumerate(tiles(y, 64, 1)):
        assert torch.allclose(out["sq"][:, j], (part * part).sum(1), rtol=1e-5)
        assert torch.equal(out["mx"][:, j], part.amax(1))
        assert torch.equal(out["amx"][:, j], part.abs().amax(1))


def test_partials_follow_the_tile_config():
    @P.epilogue(reductions={"s": P.RowReduce(), "cs": P.ColReduce(product=True)})
    def epi(acc):
        return {"s": acc, "cs": (acc, acc)}

    for tm, tn in [(128, 192), (192, 128), (64, 256)]:
        out = epi(A, W, config=GemmConfig(tile_m=tm, tile_n=tn))
        assert out["s"].shape == (M, math.ceil(N / tn))
        assert out["cs"].shape == (math.ceil(M / tm), N)
        assert torch.allclose(out["s"].sum(1), ACC.sum(1), rtol=1e-4, atol=1e-3)
        assert torch.allclose(out["cs"].sum(0), (ACC * ACC).sum(0), rtol=1e-4)
        for i, part in enumerate(tiles(ACC, tm, 0)):
            assert torch.allclose(out["cs"][i], (part * part).sum(0), rtol=1e-5)


def test_ragged_tiles_fold_like_the_gpu():
    """The GPU runs the function where a tile overhangs the output too (accumulator and
    out-of-range operands zero) and sums fold those values; max masks them. Measured on an
    H200 (primitive_docs/logs): sum(acc + 1) over N = 200 with 128-wide tiles gets +56."""
    row, col = rnd(M, dtype=torch.float32), rnd(N, dtype=torch.float32)

    @P.epilogue(operands={"r": P.PerRow(), "b": P.PerCol()},
                reductions={"s": P.RowReduce(), "mx": P.RowReduce("max"), "cs": P.ColReduce(), "rs": P.RowReduce()})
    def epi(acc, r, b):
        return {"s": acc + 1.0, "mx": acc - 5.0, "cs": b, "rs": r}

    out = epi(A, W, r=row, b=col, config=GemmConfig(tile_m=128, tile_n=128))
    assert torch.allclose(out["s"][:, 1], (ACC[:, 128:] + 1).sum(1) + 56, rtol=1e-5, atol=1e-3)
    assert torch.equal(out["mx"][:, 1], (ACC[:, 128:] - 5).amax(1))  # the overhang (-5) is masked
    assert torch.allclose(out["rs"][:, 1], row * 128)  # a row's value over a whole 128-wide tile
    assert torch.allclose(out["cs"][2], col * 128)  # M = 300: the last M tile overhangs by 84 rows
    assert torch.equal(out["D"], ACC.bfloat16())  # stores drop the overhang


def test_store_d_false_and_default_d_is_the_accumulator():
    @P.epilogue(outputs=("o",))
    def epi(acc):
        return {"o": acc * 2}

    out = epi(A, W, dtypes={"D": torch.float32})
    assert torch.equal(out["D"], ACC) and torch.equal(out["o"], (ACC * 2).bfloat16())
    assert "D" not in epi(A, W, store_d=False)


def test_acc_pair_mode():
    n = 208  # acc_pair outputs are N/2 wide: a multiple of 8
    w = rnd(n, K, std=0.125)
    acc_ = A.float() @ w.float().T
    col, row = rnd(n, dtype=torch.float32), rnd(M, dtype=torch.float32)

    @P.epilogue(outputs=("act",), operands={"b": P.PerCol(), "r": P.PerRow()}, reductions={"s": P.RowReduce()}, mode="acc_pair")
    def epi(acc, b, r):
        g, u = P.unpack(acc * r + b)
        return {"D": P.pack(g, u), "act": P.swiglu(g, u), "s": P.pack(g, u)}

    out = epi(A, w, b=col, r=row, config=GemmConfig(tile_n=64))
    z = acc_ * row[:, None] + col
    g, u = z[:, 0::2], z[:, 1::2]
    assert out["act"].shape == (M, n // 2)
    assert torch.equal(out["D"], z.bfloat16())
    assert torch.allclose(out["act"].float(), (torch.nn.functional.silu(g) * u).bfloat16().float())
    # the last 64-wide tile overhangs by 48 columns where acc, b are 0: those fold as 0 here
    assert torch.allclose(out["s"].sum(1), z.sum(1), rtol=1e-4, atol=1e-3)


PAIR_OUTPUTS = """
@P.epilogue(outputs=("act",), pair_outputs=("pre", "swapped"), operands={"r": P.PerRow()},
            reductions={"s": P.RowReduce()}, mode="acc_pair")
def pair_outs(acc, r):
    g, u = P.unpack(acc * r)
    return {"D": P.pack(g * u, g - u), "act": P.swiglu(g, u), "pre": P.pack(g, u), "swapped": P.pack(u, g),
            "s": P.pack(g, u)}
"""


def _pair_outs():
    scope = {"P": P}
    exec(compile(PAIR_OUTPUTS, "pair_outs.py", "exec"), scope)
    return scope["pair_outs"]


def test_acc_pair_pair_outputs_store_both_lanes_at_full_width():
    n = 208
    w, r = rnd(n, K, std=0.125), rnd(M, dtype=torch.float32)
    out = _pair_outs()(A, w, r=r, config=GemmConfig(tile_n=64), dtypes={"swapped": torch.float32})
    z = (A.float() @ w.float().T) * r[:, None]
    g, u = z[:, 0::2], z[:, 1::2]
    assert out["pre"].shape == (M, n) and out["pre"].dtype == torch.bfloat16
    assert torch.equal(out["pre"], z.bfloat16())                      # both lanes, in place, rounded once
    assert out["swapped"].dtype == torch.float32
    assert torch.equal(out["swapped"][:, 0::2], u) and torch.equal(out["swapped"][:, 1::2], g)
    assert out["act"].shape == (M, n // 2)                             # a plain output stays one per pair
    assert torch.equal(out["D"][:, 0::2], (g * u).bfloat16()) and torch.equal(out["D"][:, 1::2], (g - u).bfloat16())
    assert torch.allclose(out["s"].sum(1), z.sum(1), rtol=1e-4, atol=1e-3)


def test_pair_outputs_errors_are_one_line():
    with pytest.raises(P.EpilogueError, match="pair_outputs= needs mode='acc_pair'"):
        P.epilogue(pair_outputs=("o",))(lambda acc: {"o": acc})
    with pytest.raises(P.EpilogueError, match="clash"):
        P.epilogue(outputs=("o",), pair_outputs=("o",), mode="acc_pair")(lambda acc: {})

    @P.epilogue(pair_outputs=("o",), mode="acc_pair")
    def one_lane(acc):
        x, _ = P.unpack(acc)
        return {"o": x}

    with pytest.raises(P.EpilogueError, match=r"pair output 'o': expected a pair \(use pack\(x, y\)\)"):
        one_lane(A, W)
    with pytest.raises(P.EpilogueError, match="must be bf16, fp16 or float32"):
        one_lane(A, W, dtypes={"o": torch.int32})
    with pytest.raises(P.EpilogueError, match=r"did not return \['o'\]"):
        P.epilogue(pair_outputs=("o",), mode="acc_pair")(lambda acc: {})(A, W)


@pytest.mark.spawns
def test_pair_outputs_cross_compile_for_sm90a(sm90a_compile_log):
    log = sm90a_compile_log(PAIR_OUTPUTS, "a, w = torch.randn(256, 64).bfloat16(), torch.randn(192, 64).bfloat16()\n"
                                          "pair_outs(a, w, r=torch.rand(256), config=P.GemmConfig(tile_n=64))\n")
    assert [(e["epilogue"], e["ok"]) for e in log] == [("pair_outs", True)], log


@pytest.mark.gpu
def test_pair_outputs_on_the_gpu_match_the_emulator():
    n = 208
    w, r = rnd(n, K, std=0.125), rnd(M, dtype=torch.float32)
    epi, cfg, dt = _pair_outs(), GemmConfig(tile_n=64), {"swapped": torch.float32}
    cpu = epi(A, w, r=r, config=cfg, dtypes=dt)
    gpu = epi(A.cuda(), w.cuda(), r=r.cuda(), config=cfg, dtypes=dt)
    for name in ("D", "act", "pre", "swapped"):
        # tensor-core accumulation order differs from the CPU's: a bf16 ulp at most
        assert torch.allclose(gpu[name].float().cpu(), cpu[name].float(), rtol=1e-2, atol=1e-2), name


def test_packed_pair_mode():
    z = rnd(M, 2 * N)

    @P.epilogue(outputs=("out",), reductions={"zdz": P.RowReduce()}, mode="packed_pair")
    def epi(acc, c):
        g, u = P.unpack(c)
        dg, du, out = P.dswiglu(g, u, acc)
        return {"D": P.pack(dg, du), "out": out, "zdz": g * dg + u * du}

    out = epi(A, W, c=z)
    g, u = z.float()[:, 0::2], z.float()[:, 1::2]
    s = torch.sigmoid(g)
    dg = ACC * u * s * (1 + g * (1 - s))
    du = ACC * g * s
    assert out["D"].shape == (M, 2 * N) and out["D"].dtype == torch.bfloat16
    assert torch.allclose(out["D"][:, 0::2].float(), dg, rtol=1e-2, atol=1e-2)
    assert torch.allclose(out["D"][:, 1::2].float(), du, rtol=1e-2, atol=1e-2)
    assert torch.allclose(out["zdz"].sum(1), (g * dg + u * du).sum(1), rtol=1e-4, atol=1e-3)


def test_log_sum_exp_and_select():
    tgt = torch.randint(0, N, (M,), generator=gen)
    tgt[7] = -100  # ignore_index-style: the row must stay unwritten
    tgt[8] = N

    @P.epilogue(reductions={"lse": P.RowLogSumExp(), "t": P.RowSelect(index="target")})
    def epi(acc):
        return {"lse": acc * 8.0, "t": acc * 8.0}  # large logits: the online LSE must not overflow

    out = epi(A, W, target=tgt, store_d=False, config=GemmConfig(tile_n=64))
    logits = ACC * 8.0
    assert torch.allclose(torch.logsumexp(out["lse"], 1), torch.logsumexp(logits, 1), rtol=1e-5)
    ok = (tgt >= 0) & (tgt < N)
    assert torch.equal(out["t"][ok], logits[ok].gather(1, tgt[ok, None])[:, 0])
    assert out["t"][~ok].isnan().all()


def test_rope_rotate_is_exact_in_turns_at_large_positions():
    head_dim = 128
    inv_freq = (1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)).float()
    table = P.prepare.rope_freq_table(inv_freq, head_dim, rotary_cols=128, passthrough_cols=72)
    pos = torch.arange(M, dtype=torch.float32) * 997.0  # up to ~3e5

    @P.epilogue(operands={"pos": P.PerRow(), "freq": P.PerCol()}, mode="acc_pair")
    def rope(acc, pos, freq):
        x1, x2 = P.unpack(acc)
        return {"D": P.pack(*P.rope_rotate(x1, x2, pos, freq))}

    out = rope(A, W, pos=pos, freq=table, dtypes={"D": torch.float32})
    acc = A.double() @ W.double().T
    ang = pos.double()[:, None] * inv_freq.double()[None, :]
    x1, x2 = acc[:, 0:128:2], acc[:, 1:128:2]
    ref1 = x1 * torch.cos(ang) - x2 * torch.sin(ang)
    assert (out["D"][:, 0:128:2].double() - ref1).abs().max() < 1e-4
    assert torch.equal(out["D"][:, 128:], ACC[:, 128:])  # zero frequency: exact pass-through


@pytest.mark.parametrize(
    "build, call, message",
    [
        (lambda: P.epilogue()(lambda acc, r: {"D": acc}), None, "parameter 'r' has no declaration"),
        (lambda: P.epilogue(operands={"x": P.PerRow()})(lambda acc: {}), None, "declared but not a parameter"),
        (lambda: P.epilogue(operands={"config": P.Scalar()})(lambda acc, config: {}), None, "reserved"),
        (lambda: P.epilogue(reductions={"s": P.RowReduce(product=True)}, mode="acc_pair")(lambda acc: {}), None, "acc_pair"),
        (lambda: P.epilogue(mode="packed_pair")(lambda acc: {}), None, "needs the 'c' parameter"),
    ],
)
def test_declaration_errors(build, call, message):
    with pytest.raises(P.EpilogueError, match=message):
        build()


def test_call_errors_are_one_clear_line():
    @P.epilogue(outputs=("o",), operands={"r": P.PerRow()})
    def epi(acc, r):
        return {"D": acc * r, "o": acc}

    r = rnd(M, dtype=torch.float32)
    cases = [
        (lambda: epi(A, W), "missing operand r="),
        (lambda: epi(A, W, r=r[:10]), r"shape must be \(300,\)"),
        (lambda: epi(A, W, r=r, bogus=1), "unexpected arguments"),
        (lambda: epi(A, W[:, :10], r=r), "expected \\(N, 64\\)"),
        (lambda: epi(A, W, c=rnd(M, N), r=r), "no 'c' parameter"),
        (lambda: epi(A.float(), W, r=r), "bf16/fp16"),
    ]
    for fn, msg in cases:
        with pytest.raises(P.EpilogueError, match=msg) as err:
            fn()
        assert "\n" not in str(err.value)

    @P.epilogue(outputs=("o",))
    def forgets(acc):
        return {"D": acc}

    with pytest.raises(P.EpilogueError, match=r"did not return \['o'\]"):
        forgets(A, W)

    @P.epilogue()
    def pair_in_element_mode(acc):
        return {"D": P.pack(acc, acc)}

    with pytest.raises(P.EpilogueError, match="pair"):
        pair_in_element_mode(A, W)


def test_what_the_gpu_refuses_is_refused_here_too():
    # 16-byte TMA rows: N and K multiples of 8
    @P.epilogue()
    def plain(acc):
        return {"D": acc}

    with pytest.raises(P.EpilogueError, match="multiples of 8"):
        plain(A, W[:196])
    # acc_pair outputs are stored 16-bit
    @P.epilogue(outputs=("o",), mode="acc_pair")
    def act(acc):
        return {"o": P.swiglu(*P.unpack(acc))}

    with pytest.raises(P.EpilogueError, match="16 bits"):
        act(A, W, dtypes={"o": torch.float32})
    # tiles quack's SM90 GEMM does not compile
    for bad in (dict(tile_n=100), dict(tile_m=128, tile_n=256, pingpong=True), dict(tile_m=192, tile_n=192)):
        with pytest.raises(ValueError, match="does not compile for sm_90a"):
            GemmConfig(**bad)
    # a select's index must be a fresh keyword
    for idx in ("o", "config", "c"):
        with pytest.raises(P.EpilogueError, match="fresh keyword"):
            P.epilogue(outputs=("o",), reductions={"t": P.RowSelect(index=idx)})(lambda acc: {})


@pytest.mark.spawns
def test_importing_primitives_does_not_import_quack():
    code = "import sys, epiforge, primitives, primitives.emulator; print('quack' in sys.modules or 'cutlass' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
