"""What a task's pack must not hand out: its expert's epilogues and its expert's tuning
(issue 43, point 1), found by machine.

- An epilogue is compared by what it computes, not by its name or its text: its declared
  graph (primitives/graph.py: the operations its function applies, in order, its
  parameters by the order the computation first reads them and by kind, not by name or
  place in the signature; its reductions, mode and returned values kept), or, for a quack library epilogue (P.from_quack), the library's name for it
  and the operands it binds. Two epilogues with the same key compute the same thing.
- Tuning: the (GEMM shape, config) pairs of the expert's TUNED table. A line of a pack
  text that holds such a shape and its config, or that names the task and one of those
  configs, hands out the expert's measurements.

agent/pack.py build_pack applies both before the screen (agent/screen.py), which then
judges what is left: an example holding one of the expert's epilogues is dropped; a page's
code block defining one is replaced by a note; a page naming the task's tuning is
withheld; an example's TUNED lines of the task's (shape, config) pairs are cut (a line of
another task's table can coincide with one of T's).
"""

from __future__ import annotations

import re
from pathlib import Path

from epiforge.eval.machine import expert_kernel
from epiforge.primitives.config import tuned_in_source


def epilogue_key(epi) -> tuple:
    """What `epi` computes, independent of names: see the module docstring."""
    from epiforge.primitives import graph
    from epiforge.primitives.quack_library import LazyQuackEpilogue

    kind = repr  # an operand or reduction declaration: its class and fields
    if isinstance(epi, LazyQuackEpilogue):  # P.from_quack("quack.<module>:<name>"): named, not traced
        return ("library", epi.target, tuple(sorted((k, repr(v)) for k, v in (epi._operands or {}).items())))
    if epi.from_library:
        operands = tuple(sorted((k, repr(v)) for k, v in (epi.library_operands or {}).items()))
        return ("library", epi.library_target, operands)
    g = graph.trace(epi)
    # the parameters in the order the computation first reads them (the signature's order, its
    # names, are the author's choice), then the other nodes as applied, every reference renumbered
    inputs = [i for i, node in enumerate(g.nodes) if node[0] == "input"]
    used: list[int] = []

    def uses(a):
        if a[0] == "v" and a[1] in inputs and a[1] not in used:
            used.append(a[1])
        elif a[0] == "t":
            for x in a[1]:
                uses(x)

    for node in g.nodes:
        for a in node[1:]:
            if isinstance(a, tuple):
                uses(a)
    for _, a in g.returns:
        uses(a)
    order = used + [i for i in inputs if i not in used] + [i for i in range(len(g.nodes)) if i not in inputs]
    new = {old: n for n, old in enumerate(order)}

    def renumber(a):
        if a[0] == "v":
            return ("v", new[a[1]])
        return ("t", tuple(renumber(x) for x in a[1])) if a[0] == "t" else a

    nodes = []
    for old in order:
        node = g.nodes[old]
        if node[0] == "input":
            name = node[1][1]
            nodes.append(("input", "acc" if name == "acc" else "c" if name == "c" else kind(epi.operands[name])))
        else:
            nodes.append((node[0], *[renumber(a) if isinstance(a, tuple) else a for a in node[1:]]))
    returns = tuple(sorted((("D" if name == "D" else kind(epi.reductions[name]) if name in epi.reductions
                             else "pair" if name in epi.pair_outputs else "out"), repr(renumber(a)))
                           for name, a in g.returns))
    return ("graph", epi.mode, tuple(nodes), returns)


def keys(source: str) -> set[tuple]:
    """The keys of the epilogues a trusted source (an expert kernel, a page's code block)
    defines at module level (agent/screen.py runs its definitions); none if it does not run."""
    from epiforge import primitives as P
    from epiforge.agent.screen import _definitions
    from epiforge.primitives.quack_library import LazyQuackEpilogue

    defs, ns = _definitions(source), {}
    try:
        exec(compile(defs, "<pack code>", "exec"), ns) if defs else None  # the repository's own kernels and pages
    except Exception:  # noqa: BLE001 - a page's snippet need not run alone
        return set()
    out = set()
    for epi in (v for v in ns.values() if isinstance(v, (P.Epilogue, LazyQuackEpilogue))):
        try:
            out.add(epilogue_key(epi))
        except Exception:  # noqa: BLE001 - an epilogue that does not trace is compared by nothing
            continue
    return out


def expert_answers(task, expert: Path | None = None) -> tuple[set[tuple], dict[str, str]]:
    """The expert's epilogue keys and its TUNED table ({GEMM shape: config}); none where the
    task has no expert kernel."""
    path = expert or expert_kernel(task.name)
    if path is None:
        return set(), {}
    source = Path(path).read_text(encoding="utf-8")
    return keys(source), tuned_in_source(source)


def names_tuning(task, text: str, tuned: dict[str, str]) -> bool:
    """A line of the text holds one of the expert's (shape, config) pairs, or names the task
    and one of its configs (a measurement of it: a log's table row, a sentence)."""
    if not tuned:
        return False
    named = re.compile(rf"(?<![\w-]){re.escape(task.id)}(?![\w-])|{re.escape(task.name)}")
    configs = [re.compile(rf"(?<![\w]){re.escape(c)}(?![\w])") for c in set(tuned.values())]
    return any(any(shape in line and config in line for shape, config in tuned.items())
               or (named.search(line) and any(c.search(line) for c in configs)) for line in text.splitlines())


def cut_tuning(source: str, tuned: dict[str, str]) -> str:
    """An example's source without the TUNED lines that hold one of the task's (shape, config) pairs."""
    return "".join(line for line in source.splitlines(keepends=True)
                   if not any(shape in line and config in line for shape, config in tuned.items()))
