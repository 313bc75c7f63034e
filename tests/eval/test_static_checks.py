"""eval/static_checks.py: every expert (and committed generated) kernel, every honest kernel
of tests/eval/honest_kernels/ and every kernel piece of primitive_docs/ passes unchanged;
what a kernel legitimately writes passes; each rule rejects the class of code it names."""

import ast
import re
from pathlib import Path

import pytest

from epiforge.eval.static_checks import (
    QUACK_EPILOGUES,
    SourceTooComplex,
    _Scopes,
    check_file,
    check_source,
    only_compile_errors,
    parse_bounded,
)

REPO = Path(__file__).resolve().parents[2]
KERNELS = sorted([*(p for p in REPO.glob("human_kernels/*.py") if p.stem != "__init__"),
                  *REPO.glob("generated_kernels/*/*.py")])
HONEST = sorted((REPO / "tests" / "eval" / "honest_kernels").glob("*.py"))
TASKS = sorted(p.name for p in (REPO / "tasks").iterdir() if (p / "task.toml").exists())

HEAD = 'import primitives as P\nimport torch\nimport math\nTASK = "k1_gemm_rmsnorm"\n'
EPI = '@P.epilogue(operands={"rstd": P.PerRow()})\ndef f(acc, rstd):\n    return {"D": acc * rstd}\n'


@pytest.mark.parametrize("path", KERNELS, ids=lambda p: p.stem)
def test_committed_kernels_pass(path):
    assert check_file(path) == []


def test_every_coda_task_has_an_expert_kernel():
    from epiforge import tasks
    from epiforge.eval.machine import expert_kernel

    missing = [t for t in tasks.CODA_TASKS if expert_kernel(tasks.get_task(t).name) is None]
    assert missing == []


# ---- honest kernels in other styles --------------------------------------------------


def test_there_are_enough_honest_kernels():
    assert len(HONEST) >= 8
    assert len({p.name[:2] for p in HONEST}) >= 8  # spread over the tasks


@pytest.mark.parametrize("path", HONEST, ids=lambda p: p.stem)
def test_honest_kernel_passes(path):
    assert [str(v) for v in check_file(path)] == []
    tree = ast.parse(path.read_text())
    consts = {n.targets[0].id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Constant)}
    assert consts.get("TASK") in TASKS and path.name.startswith(consts["TASK"][:2])
    run = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    assert len(run) == 1 and [a.arg for a in run[0].args.args] == ["inputs", "prepared", "config"]
    assert len(run[0].args.defaults) == 1 and ast.literal_eval(run[0].args.defaults[0]) is None


# ---- the docs' kernel pieces ---------------------------------------------------------

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_KERNELISH = re.compile(r"def run\(|def prepare\(|@P\.epilogue|@epilogue")


def _docs_blocks() -> list[tuple[str, str]]:
    out = []
    for page in sorted((REPO / "primitive_docs").rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            if _KERNELISH.search(m.group(1)):
                out.append((f"{page.relative_to(REPO / 'primitive_docs').as_posix()}:{text.count(chr(10), 0, m.start()) + 2}",
                            m.group(1)))
    return out


def kernel_pieces(block: str) -> str:
    """What of a docs block is kernel code: its top-level functions, the imports of
    primitives/torch/math, and the module-level assignments those functions read
    (transitively); the block's test harness (random inputs, reference math, asserts)
    is left out. Wrapped with the imports and TASK a kernel file has."""
    tree = ast.parse(block)
    scopes = _Scopes(tree)
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and all(
        (a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0] in ("primitives", "torch", "math")
        for a in n.names)]
    binders = {}
    for n in tree.body:
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                for x in ast.walk(t):
                    if isinstance(x, ast.Name):
                        binders.setdefault(x.id, n)
    kept, todo = {}, list(funcs)
    while todo:
        for x in ast.walk(todo.pop()):
            if (isinstance(x, ast.Name) and isinstance(x.ctx, ast.Load) and x.id in binders
                    and scopes.of(x).resolve(x.id) is scopes.module and id(binders[x.id]) not in kept):
                kept[id(binders[x.id])] = binders[x.id]
                todo.append(binders[x.id])
    body = sorted([*imports, *kept.values(), *funcs], key=lambda n: n.lineno)
    return HEAD + "".join(ast.unparse(n) + "\n" for n in body)


DOCS = _docs_blocks()


def test_the_docs_have_kernel_pieces():
    assert len(DOCS) >= 25


@pytest.mark.parametrize("where, block", DOCS, ids=[w for w, _ in DOCS])
def test_docs_kernel_pieces_pass(where, block):
    found = check_source(kernel_pieces(block))
    if block.lstrip().startswith("# compile-fails:"):
        # deliberately GPU-invalid: where the rules see it, it is an epilogue-body breach
        assert all(v.rule in ("method", "epilogue", "epilogue_body") for v in found), [str(v) for v in found]
    else:
        assert [str(v) for v in found] == [], kernel_pieces(block)


def test_the_deliberately_broken_docs_epilogue_is_rejected():
    (block,) = [b for w, b in DOCS if "centered" in b]
    assert any(v.rule == "method" and ".mean" in v.message for v in check_source(kernel_pieces(block)))


# ---- what passes ---------------------------------------------------------------------

LEGIT = {
    "imports": 'from primitives import epilogue, PerRow, finish\nfrom primitives.config import GemmConfig\n'
               'from torch import bfloat16\nimport torch as t\nfrom typing import Any\nfrom __future__ import annotations\n'
               'x: Any = t.float32\ncfg = GemmConfig(tile_m=128, tile_n=192)\n',
    "epilogue body": '@P.epilogue(outputs=("y",), operands={"w": P.PerCol()}, reductions={"s": P.RowReduce(product=True)})\n'
                     'def f(acc, c, w):\n    x = acc + c\n    g, u = P.unpack(x)\n    return {"D": x * w, "y": -x / 2 ** 0.5, "s": (x, x)}\n',
    "wiring": 'def run(inputs, prepared, config=None):\n'
              '    a, w = inputs["h"], inputs.get("w")\n    n = w.shape[0]\n    outs = {}\n'
              '    outs["out"] = f(a, w.T.contiguous().view(n, -1), c=None, w=prepared["freq"], config=config or P.DEFAULT_CONFIG)["D"]\n'
              '    scale = 1.0 / math.sqrt(w.shape[1])\n    keys = [k for k in inputs.keys() if k != "h"]\n'
              '    buf = torch.empty(a.shape[0], dtype=torch.float32, device=a.device)\n'
              '    rows = max(len(keys), int(scale))\n    return {**outs, "x": P.finish.row_sum(buf.view(-1, 1)), "n": rows}\n',
    "prepare": 'def prepare(consts):\n    d = consts["w_qkv"].shape[1]\n'
               '    return {"freq": P.prepare.rope_freq_table(consts["inv_freq"], 128, rotary_cols=2 * d)}\n',
    "lambda and comprehension": 'pick = lambda d: sorted(d.items())\nsq = [i * i for i in range(4)]\n'
                                'def g(xs):\n    return {k: v for k, v in zip(xs, sq)}\n',
    "from_quack": 'epi = P.from_quack("quack.epilogue.library:rms_partial_epi")\n',
    "from_quack with operands": 'res = P.from_quack("quack.epilogue.library:residual_epi", operands={"res": P.Tile()})\n'
                                'rope = P.from_quack("quack.epilogue.rotary:rope_posfreq_epi")\n',
    "from_quack imported": 'from primitives import from_quack\nepi = from_quack("quack.epilogue.library:swiglu_mod")\n',
    "main guard": 'if __name__ == "__main__":\n    print("kernel")\n',
    # prepare(): weight preprocessing, once per weight set
    "prepare casts": 'def prepare(consts):\n    w = consts["w"]\n'
                     '    return {"a": w.float(), "b": w.to(torch.float32), "c": w.bfloat16(), "d": w.half(),\n'
                     '            "e": w.clone().contiguous(), "f": w.double().detach()}\n',
    "prepare stack, cat and @": 'def prepare(consts):\n    w, g = consts["w"].float(), consts["norm_weight"].float()\n'
                                '    folded = w @ g\n    w2 = w @ torch.diag(g)\n    w2 @= torch.eye(w.shape[1])\n'
                                '    both = torch.cat((w, w2)) + torch.stack((w, w2), dim=1).reshape(-1, w.shape[1])\n'
                                '    return {"folded": folded, "w": torch.matmul(w, w.T).sum(1).pow(2).rsqrt(), "both": both}\n',
    "prepare helpers": 'def fold(w, g):\n    return (w.float() @ g.float()).bfloat16()\n'
                       'def twice(x):\n    def inner(y):\n        return y.mul(2)\n    return inner(fold(x, x))\n'
                       'def prepare(consts):\n    return {"w": twice(consts["w"]), "v": fold(consts["w"], consts["g"])}\n',
    "prepare comprehension": 'def prepare(consts):\n    return {k: v.float() for k, v in consts.items()} | {"n": sum(v.float().sum() for v in consts.values())}\n',
    # names
    "local named like a builtin": 'def run(inputs, prepared, config=None):\n    input = inputs["h"]\n    type = 1\n'
                                  '    for id in range(2):\n        type += id\n    return {"out": input, "n": type}\n',
    "parameter named like a builtin": 'def f(getattr, *, len=3):\n    return getattr\n',
    "comprehension variable named like a builtin": 'ids = [id for id in range(3)]\n',
    # defaults and annotations
    "constant defaults": 'EPS = 1e-6\ndef f(x, dim=-1, t=(1, 2), s=-1.5, flag=None, eps=EPS, half=1 / 2, dt=torch.float32,\n'
                         '      cfg=P.DEFAULT_CONFIG, *, key="D", neg=-EPS):\n    return x\n'
                         'g = lambda x, k=-1: x\n',
    "typing in annotations": 'import typing\nimport typing as ty\nfrom typing import Optional, get_type_hints\n'
                             'def f(x: typing.Optional[int], y: ty.List["torch.Tensor"] = None, *a: ty.Any,\n'
                             '      **k: dict[str, torch.Tensor]) -> Optional["P.GemmConfig"]:\n'
                             '    z: typing.Dict[str, int] = {}\n    w: "anything(at all)" = 1\n    return None\n'
                             'def g(c: P.GemmConfig | None = None, o: object = None, t: type = None) -> torch.Tensor:\n'
                             '    return c\n',
    "string annotation is not read": 'def f(x: "__import__(\'os\').system(\'x\')"):\n    return x\n',
    # epilogue bodies
    "epilogue with module constants": 'EPS = 1e-6\nHALF = 1 / 2\nINV_SQRT2 = 1 / math.sqrt(2.0)\nMODE = "tanh"\nFAST = True\n'
                                      '@P.epilogue()\ndef f(acc):\n    y = acc * INV_SQRT2 + EPS\n'
                                      '    if FAST and MODE == "tanh":\n        y = y * HALF\n    elif not FAST:\n        pass\n'
                                      '    z = y if EPS > 0 else -y\n    for i in range(3):\n        z = z + i * HALF\n'
                                      '    z = z + acc * math.pi\n    return {"D": z, }\n',
    "epilogue with imported math": 'from primitives import epilogue, exp, unpack, pack, swiglu\n'
                                   '@epilogue(outputs=("o",), mode="acc_pair")\ndef f(acc):\n    g, u = unpack(acc)\n'
                                   '    return {"D": pack(exp(g), u), "o": swiglu(*unpack(acc))}\n',
    "epilogue helpers": 'def sq(x):\n    return x * x\ndef rms_term(x, w):\n    """the helper\'s docstring"""\n'
                        '    return sq(x) * w\n@P.epilogue(outputs=("y",), operands={"w": P.PerCol()})\n'
                        'def f(acc, w):\n    return {"D": rms_term(acc, w), "y": sq(acc)}\n'
                        'def run(inputs, prepared, config=None):\n    return {"n": sq(2)}\n',
    "epilogue math on pairs": '@P.epilogue(outputs=("o",), reductions={"s": P.RowReduce()}, mode="packed_pair")\n'
                              'def f(acc, c):\n    gate, up = P.unpack(c)\n    dg, du, out = P.dswiglu(gate, up, acc)\n'
                              '    r1, r2 = P.rope_rotate(gate, up, 1.0, 2.0)\n'
                              '    return {"D": P.pack(P.fma(dg, 1.0, r1 - r1), du), "o": P.silu(out) * P.sigmoid(out) + P.rsqrt(P.log(P.exp(out))),\n'
                              '            "s": gate * dg + up * du}\n',
    "epilogue comparison as a value": '@P.epilogue()\ndef f(acc):\n    return {"D": (acc > 0.0) * acc}\n',
    "captured number": 'def scaled_by(k):\n    @P.epilogue()\n    def scaled(acc):\n        return {"D": acc * k}\n    return scaled\n',
    # fresh locals may be written into
    "writes into fresh locals": EPI + 'def run(inputs, prepared, config=None):\n    out = f(inputs["h"], inputs["w"], rstd=inputs["rstd"])\n'
                                '    out["extra"] = 1\n    res = out\n    res["alias of a fresh local"] = 2\n    d = dict(inputs)\n    d["h"] = None\n    del d["h"]\n'
                                '    buf = torch.zeros(4)\n    buf[0] = 1.0\n    like = inputs["h"].new_zeros(3)\n    like[1:] = 2.0\n'
                                '    rows = [x for x in range(3)]\n    rows[0] += 1\n    both, other = {}, []\n    both["x"] = other\n'
                                '    maybe = {} if config else {"a": 1}\n    maybe["b"] = 2\n'
                                '    n = inputs["h"].shape[0]\n    n += 1\n    total = 0\n    for i in range(3):\n        total += i\n'
                                '    s = 1.0 / n\n    s *= 2\n    t = P.finish.row_sum(buf.view(1, -1))\n    t[0] = 0.0\n'
                                '    return {"out": out["D"], "n": n + total + s}\n',
    "lazy iterators used up at once": 'def f(xs, ys, pairs, g):\n    for i, (a, b) in enumerate(zip(xs, ys)):\n        pass\n'
                                      '    d = dict(zip(xs, ys))\n    a, b = zip(*pairs)\n    m = [*map(int, xs)]\n    g(*zip(xs, ys))\n'
                                      '    r = list(reversed(xs)) + sorted(filter(None, xs))\n    return [x for x in map(abs, xs)], d, a, b, m, r\n',
    "generator consumed at once": 'def f(xs):\n    return sum(x * x for x in xs) + any(x for x in xs) + len(tuple(x for x in xs))\n'
                                  'n = max((i for i in range(3)), default=0)\n',
    "data as values": 'def run(inputs, prepared, config=None):\n    cfg = config if isinstance(config, P.GemmConfig) else P.DEFAULT_CONFIG\n'
                      '    kinds = (P.PerRow, P.PerCol)\n    try:\n        pass\n    except P.EpilogueError:\n        raise\n'
                      '    return {"cfg": cfg, "dt": torch.bfloat16, "t": torch.Tensor, "pi": math.pi, "k": kinds}\n',
    "math functions": 'import math as m\nfrom math import sqrt\nscale = m.sqrt(2) + sqrt(3)\nf = m.floor\n',
    "out= to the builtin dict and to the file's own def": (
        'def pick(x, out):\n    return out\n\n\ndef run(inputs, prepared, config=None):\n'
        '    return dict(out=pick(inputs["h"], out=inputs["h"]))\n'),
    "finfo fields": 'def run(inputs, prepared, config=None):\n    eps = torch.finfo(torch.float32).eps\n'
                    '    big = torch.finfo(inputs["h"].dtype).max + torch.iinfo(torch.int32).min\n'
                    '    return {"eps": eps, "tiny": torch.finfo(torch.bfloat16).tiny, "big": big}\n',
}


@pytest.mark.parametrize("name", sorted(LEGIT))
def test_legitimate_code_passes(name):
    code = HEAD + (LEGIT["epilogue body"] if name == "wiring" else "") + LEGIT[name]
    assert [str(v) for v in check_source(code)] == [], code


# ---- what each rule rejects ----------------------------------------------------------

C = 'C = {}\nL = []\n'  # module-level state a kernel could write into through an alias

BAD = {
    # name: (code, rule, fragment of the message)
    "os": ("import os\n", "import", "import os"),
    "relative import": ("from . import x\n", "import", "import"),
    "torch submodule": ("import torch.nn.functional as F\n", "import", "torch.nn.functional"),
    "from torch import matmul": ("from torch import matmul\n", "import", "matmul"),
    "from torch import cat": ("from torch import cat\n", "import", "cat"),
    "tasks": ("from tasks import get_task\n", "import", "tasks"),
    "star": ("from math import *\n", "import", "*"),
    "torch.matmul": ("y = torch.matmul\n", "torch", "torch.matmul"),
    "torch.cuda": ("s = torch.cuda.Stream()\n", "torch", "torch.cuda.Stream"),
    "torch.compile": ("f = torch.compile\n", "torch", "torch.compile"),
    "module as value": ("T = torch\n", "torch", "used as a value"),
    "P internals": ("e = P.emulator\n", "primitives", "primitives.emulator"),
    "P.Epilogue": ("e = P.Epilogue\n", "primitives", "primitives.Epilogue"),
    "finish internals": ("e = P.finish.FINISHERS\n", "primitives", "FINISHERS"),
    "method": ("def f(x):\n    return x.sum()\n", "method", ".sum"),
    "cast": ("def f(x):\n    return x.float()\n", "method", ".float"),
    "copy_": ("def f(x, y):\n    x.copy_(y)\n", "method", ".copy_"),
    "item": ("def f(x):\n    return x.item()\n", "method", ".item"),
    "private": ("def f(x):\n    return x._base\n", "private", "._base"),
    "dunder attr": ("def f(x):\n    return x.__class__\n", "private", ".__class__"),
    "dunder name": ("b = __builtins__\n", "name", "__builtins__"),
    "getattr": ("def f(x):\n    return getattr(x, 'mm')\n", "name", "getattr"),
    "open": ("def f():\n    return open('x')\n", "name", "open"),
    "exec": ("exec('1')\n", "name", "exec"),
    "undefined": ("def f():\n    return mystery\n", "name", "mystery"),
    "module-level builtin binding": ("input = 1\n", "name", "shadows"),
    "module-level allowed builtin binding": ("sum = lambda g: g\n", "name", "shadows"),
    "module-level builtin def": ("def getattr(x, n):\n    return x\n", "name", "shadows"),
    "rebinding P": ("P = torch\n", "name", "shadows the imported"),
    "parameter named like an import": ("def f(torch):\n    return torch.empty(1)\n", "name", "shadows the imported"),
    "imported twice": ("import math as P\n", "name", "imported twice"),
    "matmul": ("def f(a, b):\n    return a @ b\n", "matmul", "@"),
    "imatmul": ("def f(a, b):\n    a @= b\n", "matmul", "@="),
    "global": ("n = 0\ndef f():\n    global n\n    n += 1\n", "state", "global"),
    "nonlocal": ("def f():\n    n = 0\n    def g():\n        nonlocal n\n", "state", "nonlocal"),
    "module dict write": ("C = {}\ndef f(x):\n    C['k'] = x\n", "state", "'C'"),
    "closure write": ("def f():\n    c = {}\n    def g(x):\n        c['k'] = x\n    return g\n", "state", "'c'"),
    "prepared write": ("def run(inputs, prepared, config=None):\n    prepared['x'] = 1\n", "state", "prepared"),
    "attribute store": ("def f(x):\n    x.cache = 1\n", "state", ".cache"),
    "attribute store on a module": ("P.DEFAULT_CONFIG = None\n", "state", ".DEFAULT_CONFIG"),
    "mutable default": ("def f(x, c={}):\n    return c\n", "state", "default"),
    "call default": ("def f(x, c=dict()):\n    return c\n", "state", "default"),
    "decorator": ("def deco(f):\n    return f\n@deco\ndef g(acc):\n    return acc\n", "state", "decorator"),
    "class": ("class A:\n    pass\n", "state", "class"),
    "generator": ("def f():\n    yield 1\n", "state", "generator"),
    # state through aliases and every binding form
    "write through an alias": (C + "def f(v):\n    c = C\n    c['k'] = v\n", "state", "'c'"),
    "write through a for target": (C + "def f(v):\n    for c in (C,):\n        c['k'] = v\n", "state", "'c'"),
    "comprehension target writes": (C + "def f(v):\n    return [0 for C['k'] in [v]]\n", "state", "comprehension target"),
    "comprehension target writes at module level": (C + "x = [0 for C['k'] in [1]]\n", "state", "comprehension target"),
    "for target writes": (C + "def f(v):\n    for C['k'] in [v]:\n        pass\n", "state", "for target"),
    "with target writes": (C + "def f(x):\n    with x as C['k']:\n        pass\n", "state", "with target"),
    "augmented alias": (C + "def f():\n    lst = L\n    lst += [1]\n", "state", "augmented assignment to 'lst'"),
    "augmented parameter": ("def f(lst):\n    lst += [1]\n", "state", "augmented assignment to 'lst'"),
    "walrus alias": (C + "def f(v):\n    if (c := C):\n        c['k'] = v\n", "state", "'c'"),
    "conditional alias": (C + "def f(v):\n    c = C if v else {}\n    c['k'] = v\n", "state", "'c'"),
    "or alias": (C + "def f(v):\n    c = v or C\n    c['k'] = v\n", "state", "'c'"),
    "helper-returned alias": (C + "def get():\n    return C\ndef f(v):\n    c = get()\n    c['k'] = v\n", "state", "'c'"),
    "max returns an argument": (C + "def f(v):\n    c = max([C], key=len)\n    c['k'] = v\n", "state", "'c'"),
    "rebound to an alias": (C + "def f(v):\n    c = {}\n    c = C\n    c['k'] = v\n", "state", "'c'"),
    "unpacked alias": (C + "def f(v):\n    c, d = C, {}\n    c['k'] = v\n", "state", "'c'"),
    "except target": ("def f(v):\n    try:\n        pass\n    except KeyError as e:\n        e['k'] = v\n", "state", "'e'"),
    "nested write": (C + "def f(v):\n    d = {'c': C}\n    d['c']['k'] = v\n", "state", "d['c'][...]"),
    "write into an expression": (C + "def f(v):\n    (C or {})['k'] = v\n", "state", "writing into"),
    "del through an alias": (C + "def f():\n    c = C\n    del c['k']\n", "state", "'c'"),
    "write into a parameter": ("def f(x):\n    x['k'] = 1\n", "state", "'x'"),
    "write into an input": ("def run(inputs, prepared, config=None):\n    r = inputs['rstd']\n    r[:] = 1.0\n", "state", "'r'"),
    "out=": ("def f(x):\n    return torch.zeros(3, out=x)\n", "state", "out="),
    "out= on anything": ("def f(g, x):\n    return g(x, out=x)\n", "state", "out="),
    "out= on a dict that is not the builtin": ("def f(dict, x):\n    return dict(3, out=x)\n", "state", "out="),
    "**kwargs into torch": ("def f(kw):\n    return torch.zeros(3, **kw)\n", "state", "**kwargs"),
    "**kwargs into a method": ("def f(x, kw):\n    return x.view(**kw)\n", "state", "**kwargs"),
    "escaping generator": ("def f(x):\n    return (i for i in x)\n", "state", "generator expression"),
    "generator into a local consumer": ("def f(x):\n    sum = lambda g: g\n    return sum(i for i in x)\n", "state", "generator expression"),
    "generator into zip": ("def f(x):\n    return zip(i for i in x)\n", "state", "lazy iterator"),
    "lazy iterator at module level": ("CALLS = enumerate(range(10 ** 9))\ndef run(inputs, prepared, config=None):\n"
                                      "    for n, _ in CALLS:\n        break\n", "state", "lazy iterator"),
    "lazy iterator kept in a function": ("def f(a, b):\n    pairs = zip(a, b)\n    return [p for p in pairs]\n", "state", "lazy iterator"),
    "lazy iterator in prepared": ("def prepare(c):\n    return {'it': map(int, range(3))}\n", "state", "lazy iterator"),
    "async": ("async def f():\n    pass\n", "state", "async"),
    # introspection
    "gi_frame": ("def f(y):\n    return (x for x in y).gi_frame.f_back\n", "introspection", "gi_frame"),
    "gi_frame in a consumer": ("def f(y):\n    return sum(x for x in y).gi_frame\n", "introspection", "gi_frame"),
    "f_back": ("def f(g):\n    return g.f_back\n", "introspection", "f_back"),
    "f_globals": ("def f(g):\n    return g.f_globals['x']\n", "introspection", "f_globals"),
    "f_locals": ("def f(g):\n    return g.f_locals\n", "introspection", "f_locals"),
    "f_builtins": ("def f(g):\n    return g.f_builtins\n", "introspection", "f_builtins"),
    "co_consts": ("def f(g):\n    return g.co_consts\n", "introspection", "co_consts"),
    "gi_yieldfrom": ("def f(g):\n    return g.gi_yieldfrom\n", "introspection", "gi_yieldfrom"),
    "cr_frame": ("def f(g):\n    return g.cr_frame\n", "introspection", "cr_frame"),
    "ag_frame": ("def f(g):\n    return g.ag_frame\n", "introspection", "ag_frame"),
    "tb_frame": ("def f():\n    try:\n        1 / 0\n    except ZeroDivisionError as e:\n        return e.tb_frame\n", "introspection", "tb_frame"),
    "tb_next": ("def f(t):\n    return t.tb_next\n", "introspection", "tb_next"),
    "cell_contents": ("def f(c):\n    return c.cell_contents\n", "introspection", "cell_contents"),
    "func_globals": ("def f(g):\n    return g.func_globals\n", "introspection", "func_globals"),
    "mro": ("def f(t):\n    return t.mro()\n", "introspection", "mro"),
    "introspection in prepare": ("def prepare(c):\n    return {'g': c.f_globals}\n", "introspection", "f_globals"),
    "introspection at module level": ("x = (i for i in []).gi_frame\n", "introspection", "gi_frame"),
    "match": ("def f(g):\n    match g:\n        case object(gi_frame=fr):\n            return fr\n", "introspection", "match"),
    # typing: annotations only
    "typing.get_type_hints": ("import typing\ndef g(f):\n    return typing.get_type_hints(f)\n", "typing", "typing.get_type_hints"),
    "typing as t": ("import typing as t\ndef g(f):\n    return t.get_type_hints(f)\n", "typing", "typing.get_type_hints"),
    "get_type_hints imported as": ("from typing import get_type_hints as g\ndef h(f):\n    return g(f)\n", "typing", "typing.get_type_hints"),
    "typing.cast": ("from typing import cast\nx = cast(int, 1)\n", "typing", "typing.cast"),
    "ForwardRef": ("import typing\nr = typing.ForwardRef('x')\n", "typing", "typing.ForwardRef"),
    "NamedTuple": ("from typing import NamedTuple\nN = NamedTuple('N', [('a', int)])\n", "typing", "typing.NamedTuple"),
    "TypedDict": ("import typing\nD = typing.TypedDict('D', {'a': int})\n", "typing", "typing.TypedDict"),
    "NewType": ("import typing\nN = typing.NewType('N', int)\n", "typing", "typing.NewType"),
    "TypeVar": ("import typing\nT = typing.TypeVar('T')\n", "typing", "typing.TypeVar"),
    "evaluate_forward_ref": ("import typing\ne = typing.evaluate_forward_ref\n", "typing", "typing.evaluate_forward_ref"),
    "get_args": ("from typing import get_args, get_origin\na = get_args(int), get_origin(int)\n", "typing", "typing.get_args"),
    "typing module as value": ("import typing\nt = typing\n", "typing", "used as a value"),
    "typing alias as value": ("from typing import Optional\nOpt = Optional[int]\n", "typing", "typing.Optional"),
    "call in an annotation": ("import typing\ndef f(x: typing.cast(int, 1)):\n    pass\n", "typing", "in an annotation"),
    "lambda in an annotation": ("def f(x: (lambda: 1)()):\n    pass\n", "typing", "in an annotation"),
    "annotation": ("def f(x: getattr(torch, 'x')):\n    pass\n", "name", "getattr"),
    # from_quack
    "from_quack variable": ("t = 'quack.epilogue.library:swiglu_mod'\ne = P.from_quack(t)\n", "from_quack", "literal"),
    "from_quack elsewhere": ("e = P.from_quack('tasks.k1_gemm_rmsnorm.reference:reference')\n", "from_quack", "literal"),
    "from_quack unknown name": ("e = P.from_quack('quack.epilogue.library:os')\n", "from_quack", "literal"),
    "from_quack other module": ("e = P.from_quack('quack.epilogue.ops:ColVecLoad')\n", "from_quack", "literal"),
    "from_quack extra argument": ("e = P.from_quack('quack.epilogue.library:swiglu_mod', None)\n", "from_quack", "literal"),
    "from_quack extra keyword": ("e = P.from_quack('quack.epilogue.library:swiglu_mod', name='x')\n", "from_quack", "literal"),
    "from_quack splat": ("kw = {}\ne = P.from_quack('quack.epilogue.library:swiglu_mod', **kw)\n", "from_quack", "literal"),
    "from_quack in a function": ("def run(inputs, prepared, config=None):\n    e = P.from_quack('quack.epilogue.library:swiglu_mod')\n",
                                 "from_quack", "module level"),
    "from_quack in a lambda": ("g = lambda: P.from_quack('quack.epilogue.library:swiglu_mod')\n", "from_quack", "module level"),
    "from_quack alias": ("fq = P.from_quack\ne = fq('quack.epilogue.library:swiglu_mod')\n", "from_quack", "used as a value"),
    "from_quack imported alias": ("from primitives import from_quack as fq\ng = fq\n", "from_quack", "used as a value"),
    "from_quack passed around": ("def f(g):\n    return g\nf(P.from_quack)\n", "from_quack", "used as a value"),
    # primitives and torch callables only as direct callees
    "P.epilogue alias": ("e = P.epilogue\n@e()\ndef f(acc):\n    return {'D': acc}\n", "primitives", "decorator"),
    "P.epilogue call form": ("def g(acc):\n    return {'D': acc}\ne = P.epilogue()(g)\n", "primitives", "decorator"),
    "bare P.epilogue decorator": ("@P.epilogue\ndef f(acc):\n    return {'D': acc}\n", "state", "decorator"),
    "finisher as value": ("f = P.finish.row_sum\n", "primitives", "used as a value"),
    "primitive math as value": ("f = P.exp\n", "primitives", "used as a value"),
    "pick_config as value": ("from primitives.config import pick_config\np = pick_config\n", "primitives", "used as a value"),
    "torch allocation as value": ("z = torch.empty\n", "torch", "used as a value"),
    # the prepare scope
    "torch math outside prepare": ("def run(inputs, prepared, config=None):\n    return {'x': torch.cat((inputs['a'], inputs['a']))}\n",
                                   "torch", "only inside prepare()"),
    "prepare called from run": ("def prepare(c):\n    return {'w': c['w'].float()}\n"
                                "def run(inputs, prepared, config=None):\n    return prepare(inputs)\n", "method", ".float"),
    "prepare used as a value": ("def prepare(c):\n    return {'w': c['w'].float()}\np = prepare\n", "method", ".float"),
    "helper shared with run": ("def fold(w):\n    return w.float()\ndef prepare(c):\n    return {'w': fold(c['w'])}\n"
                               "def run(inputs, prepared, config=None):\n    return {'x': fold(inputs['a'])}\n", "method", ".float"),
    "helper returned from prepare": ("def fold(w):\n    return w.float()\ndef prepare(c):\n    return {'f': fold}\n", "method", ".float"),
    "lambda returned from prepare": ("def prepare(c):\n    return {'f': lambda x: x.float()}\n", "method", ".float"),
    "nested def returned from prepare": ("def prepare(c):\n    def g(x):\n        return x @ x\n    return {'g': g}\n", "matmul", "@"),
    "bound method returned from prepare": ("def prepare(c):\n    return {'f': c['w'].float}\n", "method", "used as a value"),
    "prepare calls run": ("def prepare(c):\n    return run(c, {})\n"
                          "def run(inputs, prepared, config=None):\n    return {'x': inputs['a'].float()}\n", "method", ".float"),
    "torch.load in prepare": ("def prepare(c):\n    return {'w': torch.load('w.pt')}\n", "torch", "torch.load"),
    "torch.save in prepare": ("def prepare(c):\n    torch.save(c, 'x')\n", "torch", "torch.save"),
    "manual_seed in prepare": ("def prepare(c):\n    torch.manual_seed(0)\n", "torch", "torch.manual_seed"),
    "randn in prepare": ("def prepare(c):\n    return {'n': torch.randn(3)}\n", "torch", "torch.randn"),
    "from_file in prepare": ("def prepare(c):\n    return {'n': torch.from_file('x')}\n", "torch", "torch.from_file"),
    "torch.cuda in prepare": ("def prepare(c):\n    torch.cuda.synchronize()\n", "torch", "torch.cuda"),
    "as_strided in prepare": ("def prepare(c):\n    return {'x': c['w'].as_strided((9,), (1,))}\n", "method", ".as_strided"),
    "in-place method in prepare": ("def prepare(c):\n    c['w'].mul_(2)\n", "method", ".mul_"),
    # epilogue bodies
    "method in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc.clamp(-1.0, 1.0)}\n', "method", ".clamp"),
    "attribute in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc * acc.ndim}\n', "method", ".ndim"),
    "isinstance in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc * isinstance(acc, float)}\n',
                                  "epilogue_body", "isinstance"),
    "type test in an epilogue": ('@P.epilogue()\ndef f(acc):\n    k = 1.0 if type(acc) is float else 0.0\n    return {"D": acc * k}\n',
                                 "epilogue_body", "type"),
    "callable in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc * callable(acc)}\n', "epilogue_body", "callable"),
    "getattr in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": getattr(acc, "x", acc)}\n', "epilogue_body", "getattr"),
    "hasattr in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc * hasattr(acc, "shape")}\n', "epilogue_body", "hasattr"),
    "id in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc * id(acc)}\n', "epilogue_body", "id"),
    "len in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc * len(acc)}\n', "epilogue_body", "len"),
    "max in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": max(acc, 0.0)}\n', "epilogue_body", "max"),
    "indexing in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc[:, :1]}\n', "epilogue_body", "indexing"),
    "lambda in an epilogue": ('@P.epilogue()\ndef f(acc):\n    g = lambda x: x\n    return {"D": g(acc)}\n', "epilogue_body", "lambda"),
    "nested def in an epilogue": ('@P.epilogue()\ndef f(acc):\n    def g(x):\n        return x\n    return {"D": acc}\n',
                                  "epilogue_body", "nested function"),
    "comprehension in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": sum([acc for _ in range(2)])}\n',
                                     "epilogue_body", "comprehension"),
    "generator in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": sum(acc for _ in range(2))}\n', "epilogue_body", ""),
    "walrus in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": (y := acc) * y}\n', "epilogue_body", "walrus"),
    "import in an epilogue": ('@P.epilogue()\ndef f(acc):\n    import math\n    return {"D": acc}\n', "epilogue_body", "import"),
    "try in an epilogue": ('@P.epilogue()\ndef f(acc):\n    try:\n        y = acc\n    except Exception:\n        y = 0.0\n    return {"D": y}\n',
                           "epilogue_body", "try"),
    "with in an epilogue": ('@P.epilogue()\ndef f(acc):\n    with acc:\n        pass\n    return {"D": acc}\n', "epilogue_body", "with"),
    "while in an epilogue": ('@P.epilogue()\ndef f(acc):\n    while False:\n        pass\n    return {"D": acc}\n', "epilogue_body", "while"),
    "for over values in an epilogue": ('@P.epilogue()\ndef f(acc, c):\n    for x in (acc, c):\n        acc = acc + x\n    return {"D": acc}\n',
                                       "epilogue_body", "for loop"),
    "for over range of a value": ('@P.epilogue()\ndef f(acc):\n    for i in range(acc):\n        pass\n    return {"D": acc}\n',
                                  "epilogue_body", "for loop"),
    "if on a value": ('@P.epilogue()\ndef f(acc):\n    if acc > 0:\n        acc = -acc\n    return {"D": acc}\n', "epilogue_body", "`if`"),
    "ternary on a value": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc if acc > 0 else 0.0}\n', "epilogue_body", "if c else"),
    "and/or on values": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc or 1.0}\n', "epilogue_body", "and/or"),
    "not on a value": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc * (not acc)}\n', "epilogue_body", "not"),
    "identity comparison": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc * (acc is None)}\n', "epilogue_body", "comparison"),
    "chained comparison": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc * (0 < acc < 1)}\n', "epilogue_body", "comparison"),
    "f-string in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {f"D": acc}\n', "epilogue_body", "f-string"),
    "list in an epilogue": ('@P.epilogue(reductions={"s": P.RowReduce(product=True)})\ndef f(acc):\n    return {"s": [acc, acc]}\n',
                            "epilogue_body", "list"),
    "dict splat in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {**{"D": acc}}\n', "epilogue_body", "**"),
    "augmented assignment in an epilogue": ('@P.epilogue()\ndef f(acc, c):\n    x = acc\n    x += c\n    return {"D": acc}\n',
                                            "epilogue_body", "augmented assignment"),
    "starred target in an epilogue": ('@P.epilogue(mode="acc_pair")\ndef f(acc):\n    *g, = P.unpack(acc)\n    return {"D": acc}\n',
                                      "epilogue_body", "starred"),
    "primitive math as a value in an epilogue": ('@P.epilogue()\ndef f(acc):\n    g = P.exp\n    return {"D": g(acc)}\n',
                                                 "epilogue_body", "primitives.exp"),
    "other primitives in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": P.finish.row_sum(acc)}\n',
                                        "epilogue_body", "primitives.finish.row_sum"),
    "module tensor in an epilogue": ('W = torch.ones(1)\n@P.epilogue()\ndef f(acc):\n    return {"D": acc * W}\n', "epilogue_body", "'W'"),
    "module list in an epilogue": ('S = [2.0]\n@P.epilogue()\ndef f(acc):\n    return {"D": acc * S}\n', "epilogue_body", "'S'"),
    "rebound constant in an epilogue": ('K = 1.0\nK = 2.0\n@P.epilogue()\ndef f(acc):\n    return {"D": acc * K}\n', "epilogue_body", "'K'"),
    "local call in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc(acc)}\n', "epilogue_body", "a call of acc"),
    "captured callable in an epilogue": ('def make(g):\n    @P.epilogue()\n    def f(acc):\n        return {"D": g(acc)}\n    return f\n',
                                         "epilogue_body", "a call of g"),
    "epilogue calls an epilogue": (EPI + '@P.epilogue()\ndef h(acc):\n    return {"D": f(acc, 1.0)}\n', "epilogue_body", "a call of f"),
    "helper breaks the rules": ('def clip(x):\n    return x.clamp(0.0, 1.0)\n@P.epilogue()\ndef f(acc):\n    return {"D": clip(acc)}\n',
                                "method", "helper of epilogue f()"),
    "helper of a helper breaks the rules": ('def t(x):\n    return isinstance(x, float)\ndef clip(x):\n    return x * t(x)\n'
                                            '@P.epilogue()\ndef f(acc):\n    return {"D": clip(acc)}\n', "epilogue_body", "isinstance"),
    "helper used as a value in an epilogue": ('def sq(x):\n    return x * x\n@P.epilogue()\ndef f(acc):\n    g = sq\n    return {"D": acc}\n',
                                              "epilogue_body", "'sq'"),
    "torch in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": torch.sigmoid(acc)}\n', "epilogue", "inside epilogue f()"),
    "torch dtype in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc * (torch.float32 == 1)}\n', "epilogue", "torch.float32"),
    "math in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": math.exp(acc)}\n', "epilogue", "math.exp"),
    "a tensor's max outside finfo": ('def run(inputs, prepared, config=None):\n    return {"m": inputs["a"].max()}\n',
                                     "method", ".max"),
    "a finfo field off anything but the call": ('def run(inputs, prepared, config=None):\n    fi = torch.finfo\n'
                                                '    return {"m": fi(inputs["a"]).eps}\n', "method", ".eps"),
    "method outside an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc}\n'
                                   'def run(inputs, prepared, config=None):\n    return f(inputs["a"].clamp(0, 1), inputs["w"])\n',
                                   "method", ".clamp"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_each_rule_rejects(name):
    code, rule, fragment = BAD[name]
    found = check_source(HEAD + code)
    assert any(v.rule == rule and fragment in v.message for v in found), [str(v) for v in found]
    line = HEAD.count("\n") + 1
    assert all(v.line >= line for v in found if v.rule == rule)


def test_torch_and_math_in_an_epilogue_are_compile_errors_only():
    for body in ("torch.sigmoid(acc)", "math.exp(acc)", "torch.where(acc > 0, acc, 0.0)"):
        found = check_source(HEAD + f'@P.epilogue()\ndef f(acc):\n    return {{"D": {body}}}\n')
        assert only_compile_errors(found), [str(v) for v in found]
    found = check_source(HEAD + '@P.epilogue()\ndef f(acc):\n    return {"D": acc * isinstance(acc, float)}\n')
    assert found and not only_compile_errors(found)  # a type test is a breach, not a compile error


# ---- bounded parsing -----------------------------------------------------------------

DEEP_INDENT = "if 1:\n" + "".join("    " * i + "if 1:\n" for i in range(1, 120)) + "    " * 120 + "pass\n"
HOSTILE_SOURCES = {
    "nested parentheses": "x = " + "(" * 5000 + "1" + ")" * 5000,
    "unary chain": "-" * 100000 + "1",
    "long sum": "1" + "+1" * 200000,
    "long sum under the size limit": "1" + "+1" * 100000,
    "deep but parseable": "x = " + "-" * 150 + "1\n",
    "deep lists": "x = " + "[" * 150 + "]" * 150 + "\n",
    "deep indentation": DEEP_INDENT,
    "over 256 KiB of plain lines": "x = 1\n" * 50000,
    "a lone surrogate": 'x = "\ud800"\n',
}


@pytest.mark.parametrize("name", sorted(HOSTILE_SOURCES))
def test_oversized_or_deep_sources_are_one_size_violation(name):
    found = check_source(HOSTILE_SOURCES[name])
    assert [v.rule for v in found] == ["size"], [str(v) for v in found]
    assert "\n" not in found[0].message
    with pytest.raises(SourceTooComplex) as e:
        parse_bounded(HOSTILE_SOURCES[name], "k.py")
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)


def test_parse_bounded_parses_what_is_within_bounds():
    assert isinstance(parse_bounded("x = " + "-" * 90 + "1\n"), ast.Module)
    assert isinstance(parse_bounded("x = 1\n" * 40000), ast.Module)  # 240 KB of flat code
    assert check_source("x = 1\n" * 40000) == []
    for path in [*KERNELS, *HONEST]:
        parse_bounded(path.read_text(), str(path))


def test_syntax_errors_raise():
    with pytest.raises(SyntaxError):
        check_source("def run(:\n")
    with pytest.raises(SyntaxError):
        parse_bounded("def run(:\n")


def test_a_syntax_error_is_a_compile_error_that_names_its_line_where_there_is_one(tmp_path):
    from epiforge.eval import evaluate

    bad = tmp_path / "k1_syntax.py"
    bad.write_text(HEAD + "def run(:\n")
    r = evaluate("k1", str(bad))
    assert r.outcome.value == "COMPILE_ERROR" and r.message.startswith("line 5: syntax error: ")
    bad.write_bytes(HEAD.encode() + b"x = 1\x00\n")  # Python names no line for a NUL byte
    r = evaluate("k1", str(bad))
    assert r.outcome.value == "COMPILE_ERROR" and r.message.startswith("syntax error: ") and "None" not in r.message


# ---- the pinned quack epilogues ------------------------------------------------------


def test_pinned_quack_epilogues_are_what_quack_defines():
    from quack.epilogue import library, rotary  # ~8 s: imports CuTe-DSL
    from quack.epilogue.frontend import EpiMod

    installed = {f"{m.__name__}:{name}" for m in (library, rotary) for name, value in vars(m).items()
                 if isinstance(value, EpiMod)}
    assert QUACK_EPILOGUES == installed


# ---- through the evaluator -----------------------------------------------------------


def test_torch_inside_an_epilogue_is_a_compile_error(tmp_path):
    from epiforge.eval import evaluate

    src = (REPO / "human_kernels" / "k1_gemm_rmsnorm.py").read_text()
    bad = tmp_path / "k1_torch_in_epilogue.py"
    bad.write_text(src.replace("import primitives as P", "import primitives as P\nimport torch")
                   .replace('{"D": acc * rstd}', '{"D": torch.sigmoid(acc) * rstd}'))
    r = evaluate("k1", str(bad))
    assert r.outcome.value == "COMPILE_ERROR" and r.stage == "static"
    assert "row_scale" in r.message and "sm_90a" in r.message and r.wall_s is None  # nothing ran
    bad.write_text(src.replace("import primitives as P", "import primitives as P\nimport torch")
                   .replace('{"D": acc * rstd}', '{"D": torch.sigmoid(acc) * rstd}')
                   .replace('out = row_scale(', 'x = torch.matmul\n    out = row_scale('))
    assert evaluate("k1", str(bad)).outcome.value == "STATIC_REJECTED"  # mixed with a real breach


@pytest.mark.parametrize("head,rejected", [
    ("# -*- coding: utf-7 -*-\n", True),
    ("#!/usr/bin/env python\n# vim: set fileencoding=latin-1 :\n", True),
    ("# coding=utf-8\n", False),
    ("# -*- coding: UTF_8 -*-\n", False),
    ('"""A docstring first."""\n# coding: utf-7\n', False),  # line 2 declares only under a comment line
    ("\n\n# coding: utf-7\n", False),  # the third line is no declaration
])
def test_an_encoding_other_than_utf8_is_refused(head, rejected):
    """The rules read a kernel as UTF-8 and the runner compiles that text; an import would
    decode the file by its PEP 263 declaration (tests/exploits/coding_declaration.py)."""
    import tokenize

    source = head + HEAD + 'X = 1\n'
    found = [v for v in check_source(source) if v.rule == "encoding"]
    assert bool(found) == rejected, found
    # the rule agrees with what Python's own reader would take the encoding to be
    encoding, _ = tokenize.detect_encoding(iter(source.encode().splitlines(keepends=True)).__next__)
    assert (encoding not in ("utf-8", "utf-8-sig")) == rejected, encoding



@pytest.mark.spawns
def test_the_checkers_own_list_of_finishing_steps_is_the_built_in_ones():
    """Where primitives.finish is not loaded the checker reads its own list (it imports no
    torch): the built-in steps. The layer's expert kernel uses rope_backward, and a checker in
    a fresh process rejected it while the list lacked it."""
    import subprocess
    import sys

    code = ("import sys; from epiforge.eval.static_checks import PRIMITIVE_SUBMODULES, check_file\n"
            "v = check_file(sys.argv[1]); assert 'epiforge.primitives.finish' not in sys.modules\n"
            "from epiforge.primitives import finish\n"
            "print(len(v), sorted(finish.FINISHERS) == sorted(PRIMITIVE_SUBMODULES['finish']))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "human_kernels" / "layer_non_attention_fwd_bwd.py")],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["0", "True"], out.stdout + out.stderr
