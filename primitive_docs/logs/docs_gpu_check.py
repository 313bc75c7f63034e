"""GPU-vs-emulator checks behind the GPU facts in primitive_docs (run once on an H200).

Each epilogue runs twice: on CUDA tensors (quack) and on CPU copies (the emulator); the
report prints max|gpu - emu| per result. `python docs_gpu_check.py cpu` runs both sides on
the CPU (a smoke test of this script: every difference is 0).

On the device machine (repo root, GPU bundle installed with .gpu/env/env.sh):
    source .gpu/env/env.sh && python3 primitive_docs/logs/docs_gpu_check.py
"""

import sys
import time

import torch

from epiforge import primitives as P
from epiforge.primitives.config import GemmConfig

torch.manual_seed(0)
dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"


def both(epi, a, w, **kw):
    """(gpu results moved to the CPU, emulator results, seconds of the GPU call)."""
    t = time.time()
    g = epi(a.to(dev), w.to(dev), **{k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
    if dev == "cuda":
        torch.cuda.synchronize()
    dt = time.time() - t
    e = epi(a, w, **kw)
    return {k: v.cpu() for k, v in g.items()}, e, dt


def report(name, g, e):
    for k in e:
        gv, ev = g[k].float(), e[k].float()
        fin = torch.isfinite(ev)
        d = (gv[fin] - ev[fin]).abs().max().item() if fin.any() else float("nan")
        print(f"{name}: {k} shape={tuple(gv.shape)} max|gpu-emu|={d:.3g} "
              f"emu_nonfinite={int((~fin).sum())} gpu_at_those={gv[~fin][:4].tolist()}", flush=True)


M, N, K = 320, 200, 128  # N=200 with tile_n=128: a ragged last N tile of 72 columns (56 out of range)
a, w = torch.randn(M, K).bfloat16(), (torch.randn(N, K) / 11).bfloat16()
cfg = GemmConfig(tile_m=128, tile_n=128)
r = torch.rand(M) + 0.5

# 1. a pair on the left or on the right of a product
@P.epilogue(operands={"r": P.PerRow()}, mode="acc_pair")
def left(acc, r):
    return {"D": r * acc}


@P.epilogue(operands={"r": P.PerRow()}, mode="acc_pair")
def right(acc, r):
    return {"D": acc * r}


for epi in (left, right):
    g, e, dt = both(epi, a, w, r=r, config=cfg, dtypes={"D": torch.float32})
    report(f"1 {epi.name} (first call {dt:.1f}s)", g, e)
    if epi is left:
        g_left = g["D"]
print("1 left == right on the GPU:", torch.equal(g_left, g["D"]))

# 2. ragged tiles: what sums and maxes fold at out-of-range positions
@P.epilogue(reductions={"s1": P.RowReduce(), "sexp": P.RowReduce(), "mx": P.RowReduce("max"),
                        "amx1": P.RowReduce("absmax"), "cmx": P.ColReduce("max"), "cs1": P.ColReduce()})
def oob(acc):
    return {"s1": acc + 1.0, "sexp": P.exp(acc), "mx": acc - 100.0, "amx1": acc * 0.001 - 50.0,
            "cmx": acc - 100.0, "cs1": acc + 1.0}


a2 = torch.randn(300, K).bfloat16()  # M=300: a ragged last M tile of 44 rows (84 out of range)
g, e, dt = both(oob, a2, w, config=cfg, store_d=False)
report("2 ragged reductions", g, e)
print("  s1 last tile gpu-emu (first rows):", (g["s1"][:4, -1] - e["s1"][:4, -1]).tolist())
print("  cs1 last tile gpu-emu (first cols):", (g["cs1"][-1, :4] - e["cs1"][-1, :4]).tolist())

# 3. online LSE with large logits; RowSelect with out-of-range targets
tgt = torch.randint(0, N, (M,))
tgt[0], tgt[1] = -100, N


@P.epilogue(reductions={"lse": P.RowLogSumExp(), "t": P.RowSelect(index="tgt")})
def ce(acc):
    return {"lse": acc * 40.0, "t": acc * 40.0}


g, e, dt = both(ce, a, w, tgt=tgt, config=cfg, store_d=False)
report("3 lse/select", g, e)
print("  lse finished gpu-emu:", (torch.logsumexp(g["lse"], 1) - torch.logsumexp(e["lse"], 1)).abs().max().item())

# 4. element mode with every operand kind, outputs, product reductions
c = torch.randn(M, N).bfloat16()
col, tile = torch.randn(N).bfloat16(), torch.randn(M, N).bfloat16()


@P.epilogue(outputs=("x",), operands={"w_": P.PerCol(), "t": P.Tile(), "s": P.Scalar(), "r": P.PerRow()},
            reductions={"sq": P.RowReduce(product=True), "dw": P.ColReduce(product=True)})
def elem(acc, c, w_, t, s, r):
    x = acc + c
    return {"D": x * w_ * r + t * s, "x": x, "sq": (x, x), "dw": (acc, t)}


g, e, dt = both(elem, a, w, c=c, w_=col, t=tile, s=0.25, r=r, config=cfg, dtypes={"x": torch.float32})
report("4 element mode", g, e)

# 5. packed_pair backward of a sigmoid-gated unit with ZdZ partials
z = torch.randn(M, 2 * N).bfloat16()


@P.epilogue(outputs=("out",), reductions={"zdz": P.RowReduce()}, mode="packed_pair")
def glu_bwd(acc, c):
    x, y = P.unpack(c)
    s = P.sigmoid(x)
    dx, dy = acc * y * s * (1.0 - s), acc * s
    return {"D": P.pack(dx, dy), "out": s * y, "zdz": x * dx + y * dy}


g, e, dt = both(glu_bwd, a, w, c=z, config=cfg)
report("5 packed_pair", g, e)

# 6. acc_pair with PerCol/Tile pairs, an output and a pair reduction (N2/2 = 104: a multiple of 8)
N2 = 208
w2 = (torch.randn(N2, K) / 11).bfloat16()


@P.epilogue(outputs=("h",), operands={"b": P.PerCol(), "t": P.Tile()}, reductions={"s": P.RowReduce()},
            mode="acc_pair")
def pair(acc, b, t):
    gt, up = P.unpack(acc + b + t)
    return {"D": P.pack(gt, up), "h": P.swiglu(gt, up), "s": P.pack(gt * gt, up * up)}


g, e, dt = both(pair, a, w2, b=torch.randn(N2).bfloat16(), t=torch.randn(M, N2).bfloat16(), config=cfg)
report("6 acc_pair", g, e)

# 6b. RowSelect in acc_pair mode picks a lane by the index's parity
tgt2 = torch.randint(0, N2, (M,))


@P.epilogue(reductions={"t": P.RowSelect(index="tgt")}, mode="acc_pair")
def pair_select(acc):
    x, y = P.unpack(acc)
    return {"t": P.pack(x, y * 2.0)}


g, e, dt = both(pair_select, a, w2, tgt=tgt2, config=cfg, store_d=False)
report("6b acc_pair select", g, e)

# 7. fast transcendental functions
@P.epilogue()
def ex(acc):
    return {"D": P.exp(acc) + P.log(acc * acc + 1.0) + P.rsqrt(acc * acc + 1.0)}


g, e, dt = both(ex, a, w, dtypes={"D": torch.float32})
rel = ((g["D"] - e["D"]).abs() / e["D"].abs().clamp_min(1e-30)).max().item()
print(f"7 exp/log/rsqrt fp32: max rel |gpu-emu| = {rel:.3g}", flush=True)

# 8. which operands read 0 at out-of-range positions
@P.epilogue(operands={"b": P.PerCol(), "t": P.Tile(), "r": P.PerRow()},
            reductions={"sb": P.RowReduce(), "sc": P.RowReduce(), "st": P.RowReduce(), "sr": P.RowReduce(),
                        "cr": P.ColReduce(), "cb": P.ColReduce()})
def oobops(acc, c, b, t, r):
    return {"sb": b, "sc": c, "st": t, "sr": r, "cr": r, "cb": b}


g, e, dt = both(oobops, a, w, c=torch.randn(M, N), b=torch.randn(N), t=torch.randn(M, N).bfloat16(),
                r=torch.rand(M) + 1, config=GemmConfig(tile_m=128, tile_n=128), store_d=False)
report("8 operands at out-of-range positions (M=320: 64 rows out of range)", g, e)

# 9. shapes and arguments the emulator accepts
if dev == "cuda":
    for name, fn in [
        ("9 K=60", lambda: P.epilogue()(lambda acc: {"D": acc})(a[:, :60].to(dev), w[:, :60].to(dev))),
        ("9 N=100 D only", lambda: P.epilogue()(lambda acc: {"D": acc})(a.to(dev), w[:100].to(dev))),
        ("9 N=196 D only", lambda: P.epilogue()(lambda acc: {"D": acc})(a.to(dev), w[:196].to(dev))),
        ("9 acc_pair N=200 D only", lambda: P.epilogue(mode="acc_pair")(lambda acc: {})(a.to(dev), w.to(dev))),
        ("9 acc_pair N=200 with an output (N/2=100)",
         lambda: P.epilogue(outputs=("h",), mode="acc_pair")(lambda acc: {"h": P.swiglu(*P.unpack(acc))})(
             a.to(dev), w.to(dev), config=GemmConfig(tile_n=128))),
        ("9 Scalar cuda tensor", lambda: P.epilogue(operands={"s": P.Scalar()})(lambda acc, s: {"D": acc * s})(
            a.to(dev), w.to(dev), s=torch.tensor([2.0], device=dev))),
        ("9 w.T view", lambda: P.epilogue()(lambda acc: {"D": acc})(a.to(dev), w.T.contiguous().to(dev).T)),
    ]:
        try:
            fn()
            torch.cuda.synchronize()
            print(name, "OK", flush=True)
        except Exception as ex_:
            print(name, "ERR", type(ex_).__name__, str(ex_).splitlines()[-1][-120:], flush=True)
print("done")
