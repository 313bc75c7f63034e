"""An epilogue as data (primitives/graph.py): every expert kernel's epilogues, traced into
graphs and replayed from their JSON form, give the kernel's outputs bit for bit; a graph
from an untrusted writer is checked before it runs; a function that does more than compute
with its values does not trace."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from epiforge import primitives as P
from epiforge import tasks
from epiforge.eval.machine import expert_kernel
from epiforge.primitives import graph
from epiforge.tasks.tolerance_margins import load_expert, run_expert

REPO = Path(__file__).resolve().parents[2]
TASKS = [t for t in tasks.load_catalogue()[0] if expert_kernel(t.name)]


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) \
            and torch.equal(a.isnan(), b.isnan())
    return a == b


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_every_expert_kernel_gives_the_same_bits_from_its_replayed_graphs(task):
    """The kernel's run() with each @epilogue replaced by its graph (rebuilt from JSON),
    against the kernel as written, on the task's first smoke shape; the replay must have
    replaced an epilogue unless the kernel uses quack's library epilogues only, and every
    module-level epilogue traces."""
    module = load_expert(task)
    dims = _smoke_dims(task)
    inputs = task.make_inputs(dims, seed=3, device="cpu")
    direct = run_expert(task, module, inputs)
    with graph.replaying():
        replayed = run_expert(task, module, inputs)
    assert _same(direct, replayed), task.id
    epilogues = [v for v in vars(module).values() if isinstance(v, P.Epilogue) and not v.from_library]
    assert not epilogues or any(e._replay is not None for e in epilogues), task.id
    for e in epilogues:  # those the shape did not call (a head width of its own) trace too
        assert graph.Graph.from_json(graph.trace(e).to_json()).nodes


def _smoke_dims(task) -> dict:
    for shape in tasks.shape_sets()["smoke"]:
        try:
            task.gemm_shapes(shape.dims())
            return shape.dims()
        except (KeyError, ValueError, tasks.TaskError):
            continue
    raise AssertionError(f"{task.id}: no smoke shape")


def _toy():
    @P.epilogue(outputs=("y",), operands={"w": P.PerCol()}, reductions={"s": P.RowReduce(product=True)})
    def toy(acc, c, w):
        x = 2.0 * acc + c
        g = P.where(x > 0.5, P.silu(x), -x / 3)
        return {"D": x * w, "y": g ** 2, "s": (x, x)}
    return toy


def _call_cases():
    g = torch.Generator().manual_seed(5)
    x, y, z = (torch.randn(64, generator=g) * 3 for _ in range(3))
    pos, hi, lo = torch.arange(64.0) * 37, torch.rand(64, generator=g) / 7, torch.rand(64, generator=g) * 1e-9
    one = {name: ((x,), "x") for name in graph.CALLS}
    one.update(swiglu=((x, y), "g, u"), dswiglu=((x, y, z), "g, u, d"), fma=((x, y, z), "a, b, c"),
               max=((x, y), "a, b"), min=((x, y), "a, b"), rope_rotate=((x, y, pos, (hi, lo)), "a, b, p, f"),
               pack=((x, y), "a, b"), unpack=((P.pack(x, y),), "p"))
    one.pop("where")
    return one


@pytest.mark.parametrize("name", sorted(set(graph.CALLS) - {"where"}))
def test_every_primitive_call_replays_to_the_same_bits(name):
    """Each primitive a graph may hold, called on values through a traced graph, gives what
    calling it gives (the multi-valued ones value by value); `where` in the toy test."""
    args, params = _call_cases()[name]
    names = [p.strip() for p in params.split(",")]
    g = graph.Graph(params=("acc", *names),
                    nodes=(("input", ("k", "acc")), *(("input", ("k", p)) for p in names),
                           ("call", name, *(("v", i + 1) for i in range(len(names))))),
                    returns=(("D", ("v", len(names) + 1)),))
    g.check()
    want = getattr(P, name)(*args)
    got = graph.run(graph.Graph.from_json(g.to_json()), {"acc": None, **dict(zip(names, args))})["D"]
    assert _same(tuple(want) if isinstance(want, tuple) else want, tuple(got) if isinstance(got, tuple) else got)
    # traced: the call records itself with its arity
    syms = graph.trace(P.epilogue(operands={p: P.PerRow() for p in names if p != "c"})(
        _function_of(name, names)))
    calls = [n for n in syms.nodes if n[0] == "call"]
    items = [n for n in syms.nodes if n[0] == "item"]
    assert [c[1] for c in calls] == [name] and len(items) == (0 if graph.CALLS[name] == 1 else graph.CALLS[name])


def _function_of(name, names):
    scope = {"P": P}
    params = ", ".join(names)
    exec(f"def f(acc, {params}):\n    return {{'D': P.{name}({params})}}\n", scope)  # noqa: S102 - a test-made body
    return scope["f"]


def test_a_graph_replays_in_source_order_and_round_trips_exactly():
    toy = _toy()
    g = graph.trace(toy)
    ops = [n[0] if n[0] != "call" else n[1] for n in g.nodes if n[0] != "input"]
    assert ops == ["mul", "add", "gt", "silu", "neg", "truediv", "where", "mul", "pow"], ops
    assert g.nodes[3] == ("mul", ("k", 2.0), ("v", 0))  # 2.0 * acc, as written (a reflected product)
    assert graph.Graph.from_json(g.to_json()) == g
    # constants keep every bit, NaN and -0.0 included
    odd = graph.Graph(params=("acc",), nodes=(("input", ("k", "acc")), ("mul", ("v", 0), ("k", -0.0)),
                                              ("add", ("v", 1), ("k", math.nan))), returns=(("D", ("v", 2)),))
    back = graph.Graph.from_json(odd.to_json())
    assert math.copysign(1, back.nodes[1][2][1]) == -1 and math.isnan(back.nodes[2][2][1])
    a, c, w = torch.randn(8, 16), torch.randn(8, 16), torch.randn(16)
    want, got = toy.fn(a, c, w), graph.run(g, {"acc": a, "c": c, "w": w})
    assert _same(want, got)


@pytest.mark.parametrize("body, why", [
    ("if acc > 0:\n        acc = -acc\n    return {'D': acc}", "condition on a value"),
    ("return {'D': acc.clamp(0)}", "no attribute .clamp"),
    ("a, b = acc\n    return {'D': a}", "cannot be iterated"),
    ("return {'D': torch.relu(acc)}", "TypeError"),
    ("return acc", "return a dict"),
    ("return {'D': [acc]}", "a number, not list"),
])
def test_a_function_that_does_more_than_compute_does_not_trace(body, why):
    scope = {"torch": torch, "P": P}
    exec(f"def bad(acc):\n    {body}\n", scope)  # noqa: S102 - test-made epilogue bodies
    with pytest.raises(graph.GraphError, match=why):
        graph.trace(P.epilogue()(scope["bad"]))


def test_a_graph_that_is_not_well_formed_is_refused():
    good = json.loads(graph.trace(_toy()).to_json())

    def refused(change, why):
        data = json.loads(json.dumps(good))
        change(data)
        with pytest.raises(graph.GraphError, match=why):
            graph.Graph.from_json(json.dumps(data))

    refused(lambda d: d["nodes"].append(["add", ["v", 999], ["k", 1]]), "not an earlier node")
    refused(lambda d: d["nodes"].append(["call", "system", ["k", 1]]), "unknown call")
    refused(lambda d: d["nodes"].append(["getattr", ["v", 0], ["k", "x"]]), "unknown op")
    refused(lambda d: d["nodes"].append(["add", ["v", 0], ["k", "rm -rf"]]), "bad constant")
    refused(lambda d: d["nodes"].append(["item", ["v", 0], ["k", 0]]), "multi-valued call")
    refused(lambda d: d["returns"].append(["D", ["v", 0]]), "bad returned names")
    refused(lambda d: d.update(params=["acc", "__class__"]), "parameter")
    refused(lambda d: d["nodes"].extend([["pos", ["v", 0]]] * graph.MAX_NODES), "more than")
    refused(lambda d: d["nodes"].append(["item", 5, 3]), "not an epilogue graph")  # a node of the wrong shape
    refused(lambda d: d["nodes"].append(["item"]), "bad item")
    with pytest.raises(graph.GraphError, match="not an epilogue graph"):
        graph.Graph.from_json("[1, 2")


SASS_SCRIPT = r"""
import contextlib, json, sys
from pathlib import Path
from epiforge import tasks
from epiforge.primitives import graph
from epiforge.tasks.tolerance_margins import load_expert, run_expert
from lab.bench.sass import instructions as listed, sass_of

cache, replay = Path(sys.argv[1]), sys.argv[2] == "replay"


def instructions(obj: Path) -> list:
    return listed(sass_of(obj))


MEMORY = ("LDG", "STG", "LDS", "STS", "LDSM", "STSM", "UTMALDG", "UTMASTG", "UTMAREDG", "RED", "REDG", "ATOM", "ATOMS",
          "ATOMG", "LDC", "ULDC")


def math_and_memory(ins: list) -> list:
    # the float math (F*, MUFU, the half2 ops) and the memory instructions, by opcode with
    # its modifiers, counted: what the epilogue computes and moves. Integer and move
    # instructions are left out: ptxas picks among equivalent ones (MOV or IMAD.MOV, IADD3 or
    # VIADD) differently from build to build of the very same source
    counts = {}
    for i in ins:
        words = i.split()
        op = words[1] if words[0].startswith("@") else words[0]
        base = op.split(".")[0]
        if base.startswith("F") or base in ("MUFU", "HADD2", "HMUL2", "HFMA2", "HMNMX2") or base in MEMORY:
            counts[op] = counts.get(op, 0) + 1
    return sorted(counts.items())


out = {}
for tid in sys.argv[3:]:
    task = tasks.get_task(tid)
    module = load_expert(task)
    inputs = task.make_inputs(next(s.dims() for s in tasks.shape_sets()["smoke"]), seed=0)
    before = set(cache.rglob("*.o"))
    with graph.replaying() if replay else contextlib.nullcontext():
        run_expert(task, module, inputs)
    replayed = [v for v in vars(module).values() if getattr(v, "_replay", None) is not None]
    out[tid] = {"kernels": sorted(math_and_memory(instructions(o)) for o in set(cache.rglob("*.o")) - before),
                "replayed": len(replayed)}
print(json.dumps(out))
"""


@pytest.mark.spawns
def test_replayed_graphs_compile_to_the_same_sm90a_machine_code(tmp_path):
    """The GPU side of replaying: the expert kernels with epilogues of their own (acc_pair
    SwiGLU after the norm: k2; RoPE pairs with a float-float table and D stored: k4d;
    log-sum-exp and a row select: k5; a tile operand: k6; a head-wise norm: qkn; the
    layer's three beside its library ones), cross-compiled for sm_90a as written and from
    their graphs, each way in a fresh process and cache: kernel for kernel, the same float
    math and memory instructions, opcode and modifiers, counted. (Not the whole instruction
    stream: two builds of one unchanged epilogue can differ in integer and move
    instructions, MOV for IMAD.MOV and the like, between processes and even within one,
    seen under load in the full suite.) The layer's own epilogues are k2's and k6's, the same
    source (asserted below), and an identity: it is not built here, its 12 GEMMs (9 of them
    quack's library epilogues, which replaying leaves alone) cost CI about 40 s a way."""
    import inspect

    from epiforge.eval.kernel import load_kernel_module
    from epiforge.eval.machine import expert_kernel

    layer, k2, k6 = (load_kernel_module(expert_kernel(tasks.get_task(t).name)) for t in ("layer", "k2", "k6"))
    for name, other in (("rmsnorm_swiglu", k2), ("rmsnorm_bwd", k6)):
        assert inspect.getsource(getattr(layer, name).fn) == inspect.getsource(getattr(other, name).fn), name
    runs = ["k2", "k4d", "k5", "k6", "qkn"]
    got = {}
    for way in ("direct", "replay"):
        cache = tmp_path / way
        env = {**os.environ, "QUACK_ARCH": "90", "CUTE_DSL_ARCH": "sm_90a", "EPIFORGE_CROSS_COMPILE": "1",
               "QUACK_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"}
        out = subprocess.run([sys.executable, "-c", SASS_SCRIPT, str(cache), way, *runs], env=env,
                             capture_output=True, text=True, timeout=900, cwd=REPO)
        assert out.returncode == 0, out.stderr[-2000:]
        got[way] = json.loads(out.stdout.strip().splitlines()[-1])
    for tid in runs:
        direct, replayed = got["direct"][tid], got["replay"][tid]
        assert direct["replayed"] == 0 and replayed["replayed"] >= 1, (tid, replayed["replayed"])
        assert direct["kernels"] and min(sum(n for _, n in k) for k in direct["kernels"]) > 100, tid
        assert replayed["kernels"] == direct["kernels"], tid
