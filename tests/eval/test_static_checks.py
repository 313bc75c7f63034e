"""eval/static_checks.py: every expert (and committed generated) kernel passes unchanged;
what a kernel legitimately writes passes; each rule rejects what it names."""

from pathlib import Path

import pytest

from eval.static_checks import check_file, check_source

REPO = Path(__file__).resolve().parents[2]
KERNELS = sorted([*REPO.glob("human_kernels/k*.py"), *REPO.glob("generated_kernels/*/*.py")])

HEAD = 'import primitives as P\nimport torch\nimport math\nTASK = "k1_gemm_rmsnorm"\n'


@pytest.mark.parametrize("path", KERNELS, ids=lambda p: p.stem)
def test_committed_kernels_pass(path):
    assert check_file(path) == []


def test_expert_track_is_complete():
    assert len([k for k in KERNELS if k.parent.name == "human_kernels"]) == 10


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
    "main guard": 'if __name__ == "__main__":\n    print("kernel")\n',
    # inside an epilogue a method is the sm_90a compiler's to judge (it rejects .clamp there)
    "method in an epilogue": '@P.epilogue()\ndef f(acc):\n    return {"D": acc.clamp(-1.0, 1.0)}\n',
}


@pytest.mark.parametrize("name", sorted(LEGIT))
def test_legitimate_code_passes(name):
    code = HEAD + (LEGIT["epilogue body"] if name == "wiring" else "") + LEGIT[name]
    assert check_source(code) == [], code


BAD = {
    # name: (code, rule, fragment of the message)
    "os": ("import os\n", "import", "import os"),
    "relative import": ("from . import x\n", "import", "import"),
    "torch submodule": ("import torch.nn.functional as F\n", "import", "torch.nn.functional"),
    "from torch import matmul": ("from torch import matmul\n", "import", "matmul"),
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
    "shadow builtin": ("def f(getattr):\n    return getattr\n", "name", "shadows"),
    "matmul": ("def f(a, b):\n    return a @ b\n", "matmul", "@"),
    "imatmul": ("def f(a, b):\n    a @= b\n", "matmul", "@="),
    "global": ("n = 0\ndef f():\n    global n\n    n += 1\n", "state", "global"),
    "nonlocal": ("def f():\n    n = 0\n    def g():\n        nonlocal n\n", "state", "nonlocal"),
    "module dict write": ("C = {}\ndef f(x):\n    C['k'] = x\n", "state", "'C'"),
    "closure write": ("def f():\n    c = {}\n    def g(x):\n        c['k'] = x\n    return g\n", "state", "'c'"),
    "prepared write": ("def run(inputs, prepared, config=None):\n    prepared['x'] = 1\n", "state", "prepared"),
    "attribute store": ("def f(x):\n    x.cache = 1\n", "state", ".cache"),
    "mutable default": ("def f(x, c={}):\n    return c\n", "state", "default"),
    "decorator": ("def deco(f):\n    return f\n@deco\ndef g(acc):\n    return acc\n", "state", "decorator"),
    "class": ("class A:\n    pass\n", "state", "class"),
    "generator": ("def f():\n    yield 1\n", "state", "generator"),
    "from_quack variable": ("t = 'quack.epilogue.library:swiglu_mod'\ne = P.from_quack(t)\n", "from_quack", "literal"),
    "from_quack elsewhere": ("e = P.from_quack('tasks.k1_gemm_rmsnorm.reference:reference')\n", "from_quack", "literal"),
    "torch in an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": torch.sigmoid(acc)}\n', "epilogue",
                             "inside epilogue f()"),
    "method outside an epilogue": ('@P.epilogue()\ndef f(acc):\n    return {"D": acc}\n'
                                   'def run(inputs, prepared, config=None):\n    return f(inputs["a"].clamp(0, 1), inputs["w"])\n',
                                   "method", ".clamp"),
    "annotation": ("def f(x: getattr(torch, 'x')):\n    pass\n", "name", "getattr"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_each_rule_rejects(name):
    code, rule, fragment = BAD[name]
    found = check_source(HEAD + code)
    assert any(v.rule == rule and fragment in v.message for v in found), [str(v) for v in found]
    line = HEAD.count("\n") + 1
    assert all(v.line >= line for v in found if v.rule == rule)


def test_syntax_errors_raise():
    with pytest.raises(SyntaxError):
        check_source("def run(:\n")


def test_torch_inside_an_epilogue_is_a_compile_error(tmp_path):
    from eval import evaluate

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
