"""The pack's content rule: no code the model reads for task T may pass T's check.

Every fenced code block of a page that defines an epilogue (`@P.epilogue`, `P.from_quack`)
and every expert kernel offered as an example is a *candidate*. For a session's task T each
candidate is turned, mechanically, into the kernels a model would get from it by a trivial
edit (its *adaptations*):

- an epilogue of a page: its parameters bound to T's inputs by shape (PerRow: an (M,)
  input, PerCol: (N,), Tile and `c`: (M, N), Scalar: a scalar of T), every binding tried,
  and T's outputs taken from the epilogue's tensors of the same shape whose values are near
  T's reference (an in-process run on the emulator at the first smoke shape; a binding or
  output that does not fit means no adaptation);
- an expert kernel of another task U: its source with `TASK` set to T and each module
  constant named after one of T's scalars (`ROPE_DIRECTION` for `rope_direction`) set to
  T's value, when its `run` reads only inputs T has.

Every adaptation is judged by T's real evaluation (eval.evaluate: CPU emulator, smoke
shapes plus the hidden one, a fixed seed). A candidate with an adaptation that passes is
withheld for T: a page's block is replaced by a one-line note, an example is dropped. The
verdicts are cached by (the fingerprint of the code that decides them, task files,
adaptation source): agent/data/screen_cache.json ships them for the repository's pages, new
ones go to the user cache ($EPIFORGE_SCREEN_CACHE or ~/.cache/epiforge/screen_cache.json).
The fingerprint (`fingerprint()`) hashes VERDICT_SOURCES: this file, the primitives, the
shared task code and shapes, and the CPU evaluation's modules, by their code (comments and
docstrings aside); a change there makes every cached verdict stale, so it is recomputed
(tests/agent/test_agent_pack_screen.py then asks for `python -m epiforge.agent.screen --write`).
Not in it: eval's modules that only time, compare or report (baselines, gpu_stages, timing,
stats, plausibility, compare, leaderboard, store), and the installed torch.
`python -m epiforge.agent.screen [--write]` recomputes the verdicts (--write: into the shipped file,
dropping the stale ones).
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from epiforge import ROOT as REPO

SEED = 20261201
SHIPPED_CACHE = Path(__file__).resolve().parent / "data" / "screen_cache.json"
#: what decides a verdict besides the task's own folder (hashed per task): see the docstring
VERDICT_SOURCES = ("agent/screen.py", "primitives/*.py", "tasks/*.py", "tasks/shapes.toml",
                   *(f"eval/{m}.py" for m in ("__init__", "channel", "evaluation", "guard", "isolation", "judge",
                                             "kernel", "launches", "machine", "numerics", "remote", "result",
                                             "runner", "secret_shapes", "static_checks")))
BLOCK = re.compile(r"^(?P<fence>```|~~~)[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S)
#: a looser bound than any task's tolerance: only adaptations this close go to the evaluator
PREFILTER_REL_RMS = 0.25


@dataclass(frozen=True)
class Withheld:
    where: str  # "page index, code block 1" or "example k3hf_gemm_rope"
    why: str

    def as_dict(self) -> dict:
        return {"where": self.where, "why": self.why}


def code_blocks(text: str) -> list[re.Match]:
    return [m for m in BLOCK.finditer(text) if _defines_epilogue(m.group("body"))]


def _defines_epilogue(src: str) -> bool:
    return "P.epilogue" in src or "P.from_quack" in src


def note(where: str) -> str:
    return f"[code example withheld for this task: {where} passes this task's check]\n"


# ---- adaptations --------------------------------------------------------------------------


def _definitions(src: str) -> str | None:
    """The block's definitions only (functions, classes, from_quack / constant assignments,
    and the imports they use): no example tensors, no asserts."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return None
    keep = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            keep.append(node)
        elif isinstance(node, ast.Assign) and (isinstance(node.value, ast.Constant)
                                               or "from_quack" in ast.unparse(node.value)):
            keep.append(node)
    used = {n.id for k in keep for n in ast.walk(k) if isinstance(n, ast.Name)} | {"P"}
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
               and any((a.asname or a.name.split(".")[0]) in used for a in n.names)]
    if not keep:
        return None
    body = "\n\n".join(ast.unparse(n) for n in imports + keep)
    return body if "import primitives as P" in body else "import primitives as P\n" + body


def _epilogues(defs: str) -> dict:
    from epiforge import primitives as P

    ns: dict = {}
    try:
        exec(compile(defs, "<pack code block>", "exec"), ns)  # the repository's own pages
    except Exception:
        return {}
    return {k: v for k, v in ns.items() if isinstance(v, P.Epilogue)}


def _concrete(task):
    from epiforge import tasks

    dims = tasks.shape_sets()["smoke"][0].dims()
    inputs = task.make_inputs(dims, SEED)
    ref = task.reference(inputs, dims)
    return dims, inputs, ref


def _kind_fits(kind, value, M: int, N: int, mode: str) -> bool:
    import torch

    from epiforge import primitives as P

    if isinstance(kind, P.Scalar):
        return isinstance(value, (int, float)) or (torch.is_tensor(value) and value.dim() == 0)
    if not torch.is_tensor(value) or not value.is_floating_point():
        return False
    shape = tuple(value.shape)
    if kind == "c":
        return shape in ((M, N), (M, 2 * N)) if mode == "packed_pair" else shape == (M, N)
    want = {P.PerRow: (M,), P.PerCol: (N,), P.Tile: (M, N)}.get(type(kind))
    return shape == want


def _close(got, want) -> bool:
    import torch

    if not torch.is_tensor(got) or tuple(got.shape) != tuple(want.shape):
        return False
    g, w = got.double(), want.double()
    if not torch.isfinite(g).all():
        return False
    scale = w.pow(2).mean().sqrt().clamp_min(1e-12)
    return float((g - w).pow(2).mean().sqrt() / scale) <= PREFILTER_REL_RMS


def epilogue_adaptations(src: str, task) -> list[tuple[str, str]]:
    """(what, kernel source) for each binding of the block's epilogues to `task` whose
    outputs come near the task's reference."""
    defs = _definitions(src)
    if defs is None:
        return []
    epis = _epilogues(defs)
    if not epis:
        return []
    if task.gemm is None:  # a task of several GEMMs: no one epilogue, bound to one GEMM, computes it
        return []
    dims, inputs, ref = _concrete(task)
    g = task.gemm
    a, b = inputs[g.a], inputs[g.b]
    b_nk = b if g.b_layout == "nk" else b.T
    b_expr = f'inputs["{g.b}"]' + ("" if g.b_layout == "nk" else ".T")
    M, N = a.shape[0], b_nk.shape[0]
    free = [k for k in inputs if k not in (g.a, g.b)]
    out = []
    for name, epi in sorted(epis.items()):
        params = list(epi.params)
        kinds = [("c" if p == "c" else epi.operands[p]) for p in params]
        choices = [[k for k in free if _kind_fits(kind, inputs[k], M, N, epi.mode)] for kind in kinds]
        for combo in itertools.product(*choices):
            if len(set(combo)) != len(combo):
                continue
            kw = dict(zip(params, combo))
            try:
                got = epi(a, b_nk, **{p: inputs[k] for p, k in kw.items()})
            except Exception:
                continue
            picks = [[t for t in sorted(got) if _close(got[t], ref[o.name])] for o in task.outputs]
            for outs in itertools.product(*picks):
                call = ", ".join([f'inputs["{g.a}"]', b_expr] + [f'{p}=inputs["{k}"]' for p, k in kw.items()])
                ret = ", ".join(f'"{o.name}": out["{t}"]' for o, t in zip(task.outputs, outs))
                kernel = (f'{defs}\n\nTASK = "{task.name}"\n\n\ndef run(inputs, prepared, config=None):\n'
                          f"    out = {name}({call}, config=config)\n    return {{{ret}}}\n")
                what = f"epilogue {name} with " + (", ".join(f"{p}={k}" for p, k in kw.items()) or "no operands")
                out.append((what, kernel))
    return out


def kernel_adaptations(src: str, task) -> list[tuple[str, str]]:
    """An expert kernel of another task re-targeted at `task`: TASK and the constants named
    after the task's scalars set; none when its run() reads an input the task lacks."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    have = {i.name for i in task.inputs} | {s.name for s in task.scalars}
    reads = {n.slice.value for n in ast.walk(tree) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
             and n.value.id == "inputs" and isinstance(n.slice, ast.Constant)}
    if not reads or not reads <= have:
        return []
    scalars = {s.name.upper(): s.value for s in task.scalars}
    lines = src.splitlines()
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name == "TASK":
                value = repr(task.name)
            elif name in scalars:
                v = scalars[name]
                value = repr(int(v) if float(v).is_integer() else v)
            else:
                continue
            line = lines[node.lineno - 1]
            lines[node.lineno - 1] = line[:node.value.col_offset] + value + line[node.value.end_col_offset:]
    return [("the kernel with TASK and the task's scalars set", "\n".join(lines) + "\n")]


# ---- verdicts -------------------------------------------------------------------------------


def _task_key(task) -> str:
    h = hashlib.sha256(task.name.encode())
    folder = Path(task.folder)
    for p in sorted(folder.rglob("*")) if folder.is_dir() else []:
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """A hash of VERDICT_SOURCES: Python files by their syntax tree without docstrings (a
    comment, a docstring or the layout changes no verdict), other files by their bytes."""
    h = hashlib.sha256()
    for path in sorted({p for pattern in VERDICT_SOURCES for p in REPO.glob(pattern)}):
        text = path.read_bytes()
        if path.suffix == ".py":
            tree = ast.parse(text)
            for node in ast.walk(tree):
                body = getattr(node, "body", None)
                if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                        and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                        and isinstance(body[0].value.value, str)):
                    node.body = body[1:] or [ast.Pass()]
            text = ast.dump(tree).encode()
        h.update(path.relative_to(REPO).as_posix().encode() + b"\0" + text + b"\0")
    return h.hexdigest()[:16]


def _key(task, kernel: str) -> str:
    return hashlib.sha256((fingerprint() + "\0" + _task_key(task) + "\0" + kernel).encode()).hexdigest()[:24]


def _user_cache() -> Path:
    env = os.environ.get("EPIFORGE_SCREEN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "epiforge" / "screen_cache.json"


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def passes(task, kernel: str, *, write_to: Path | None = None) -> bool:
    """Does `kernel` pass `task`'s check (eval.evaluate, CPU, smoke, fixed seed)? Cached."""
    key = _key(task, kernel)
    hit = _cached(key, write_to)
    if hit is not None:
        return bool(hit["passed"])
    from epiforge.eval import evaluate

    with tempfile.TemporaryDirectory(prefix="epiforge-screen-") as d:
        path = Path(d) / "kernel.py"
        path.write_text(kernel)
        result = evaluate(task.name, path, device="cpu", shapes="smoke", seed=SEED, compile=False)
    _store(write_to or _user_cache(), key, {"task": task.name, "passed": bool(result.passed),
                                             "outcome": result.outcome.value, "fingerprint": fingerprint()})
    return bool(result.passed)


_STORING = threading.Lock()  # sessions run side by side (generate --runs) share the cache


def _cached(key: str, write_to: Path | None) -> dict | None:
    """A verdict from the shipped cache, the user's or `write_to`; one found elsewhere than
    `write_to` is copied there, so that `--write` ships every verdict its pages need, even
    one the user cache already held."""
    for path in (SHIPPED_CACHE, _user_cache()) + ((write_to,) if write_to else ()):
        hit = _load(path).get(key)
        if hit is not None:
            if write_to is not None and path != write_to:
                _store(write_to, key, hit)
            return hit
    return None


def _store(target: Path, key: str | None = None, value: dict | None = None, *, prune: bool = False) -> None:
    """Add one verdict to `target` (a rewrite, atomic); `prune`: drop the stale ones too."""
    with _STORING:
        data = _load(target)
        if key is not None:
            data[key] = value
        if prune:
            data = {k: v for k, v in data.items() if v.get("fingerprint") == fingerprint()}
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n")
        tmp.replace(target)


def _verdict(kind: str, adapt, task, src: str, write_to: Path | None) -> str | None:
    """With `write_to` (`--write`) a cached verdict is not taken as it stands: the
    adaptations' own evaluations behind it are looked up (or run) again, so that each one is
    copied there too (tests check the shipped file for them, not only the block's verdict)."""
    key = _key(task, kind + "\0" + src)
    hit = _cached(key, write_to)
    if hit is not None and write_to is None:
        return hit["why"]
    why = None
    for what, kernel in adapt(src, task):
        if passes(task, kernel, write_to=write_to):
            why = f"{what} passes {task.id}'s check"
            break
    _store(write_to or _user_cache(), key, {"task": task.name, "why": why, "fingerprint": fingerprint()})
    return why


def shipped(task, kind: str, src: str) -> bool:
    """Is the verdict for this block ("block") or example ("example") in the shipped cache?"""
    return _key(task, kind + "\0" + src) in _load(SHIPPED_CACHE)


def screen_block(task, src: str, *, write_to: Path | None = None) -> str | None:
    """Why a page's code block is withheld for `task`, or None (cached by task and source)."""
    return _verdict("block", epilogue_adaptations, task, src, write_to)


def screen_example(task, src: str, *, write_to: Path | None = None) -> str | None:
    """Why an expert kernel offered as an example is withheld for `task`, or None."""
    return _verdict("example", kernel_adaptations, task, src, write_to)


def main(argv=None) -> int:
    import argparse

    from epiforge import tasks
    from epiforge.agent.pack import build_pack

    ap = argparse.ArgumentParser(prog="python -m epiforge.agent.screen", description=__doc__.splitlines()[0])
    ap.add_argument("--task", action="append", help="tasks to screen (default: all)")
    ap.add_argument("--write", action="store_true", help="record new verdicts in agent/data/screen_cache.json "
                                                         "and drop its stale ones")
    args = ap.parse_args(argv)
    names = args.task or [t.name for t in tasks.load_catalogue()[0]]
    for name in names:
        task = tasks.get_task(name)
        p = build_pack(task, screen_cache=SHIPPED_CACHE if args.write else None)
        print(f"{task.id}: " + ("; ".join(f"{w['where']}: {w['why']}" for w in p.withheld_code) or "nothing withheld"))
    if args.write:
        _store(SHIPPED_CACHE, prune=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
