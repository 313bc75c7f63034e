"""What a task's pack must not hand out: its expert's epilogues and its expert's tuning
(found by machine).

- An epilogue is compared by what it computes, not by its name or its text: its declared
  graph (primitives/graph.py: the operations its function applies, in order, its
  parameters by the order the computation first reads them and by kind, not by name or
  place in the signature; its reductions, mode and returned values kept), or, for a quack library epilogue (P.from_quack), the library's name for it
  and the operands it binds. Two epilogues with the same key compute the same thing.
- Tuning: the (GEMM shape, config) pairs of the expert's TUNED table, and what pages measured
  of the task's kernel. A line of a page that holds such a pair, and the lines of a sentence
  that names the task and a measurement (a tile config, a speed over GEMM-only, a ratio;
  wrapped over lines or not), are replaced by a note.

agent/pack.py build_pack applies both before the screen (agent/screen.py), which then
judges what is left: an example holding one of the expert's epilogues is dropped; a page's
code block defining one is replaced by a note; a page's lines measuring the task are
replaced by a note; an example's TUNED lines of the task's (shape, config) pairs are cut (a
line of another task's table can coincide with one of T's).
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


#: what makes a sentence that names the task a measurement of it: a tile config (128x192, with
#: or without its cluster and flags), a speed over GEMM-only (1.22x, or a bare ratio such as
#: 1.111 or 0.997), or the words for one
MEASUREMENT = re.compile(r"(?<![\w.])\d+x\d+(?:_c\dx\d)?|\d\.\d+ ?x\b|(?<![\w.])[01]\.\d{2,3}(?![\d.])|GEMM-only"
                         r"|pingpong|cooperative|cluster")
#: the note that stands in for a withheld line (it says what, never the line)
TUNING_NOTE = "[a measurement of this task's kernel, withheld from its pack]"
#: where a passage starts: a blank line ends one, a list item starts one; a table row and a
#: heading are passages of their own
_ITEM = re.compile(r"\s*(?:[-*+] |\d+\. )")
_OWN_LINE = re.compile(r"\s*(?:\||#)")
#: a sentence of a passage: up to a stop followed by a space (a ratio's dot, 1.111, is not)
_SENTENCE = re.compile(r"\S.*?(?:[.!?;](?=\s)|$)", re.S)


def _named(task) -> re.Pattern:
    """The task's name, and its id where the id is no ordinary word (k7, qkn; not "layer",
    which a page uses for the model's layers)."""
    ids = [task.name] + ([task.id] if any(c.isdigit() for c in task.id) or len(task.id) <= 4 else [])
    return re.compile("|".join(rf"(?<![\w-]){re.escape(x)}(?![\w-])" for x in ids))


def tuning_lines(task, text: str, tuned: dict[str, str]) -> list[int]:
    """The lines of a page (outside its code blocks) that hand out the expert's tuning: a line
    holding one of its (shape, config) pairs, a line naming the task and a measurement, and
    the lines of a sentence naming the task and a measurement (MEASUREMENT: a config, a speed over GEMM-only), as a log's row or a guide's
    sentence does ("k7 at 1B takes 1.22x GEMM-only at the default"), a sentence wrapped over
    lines whole ("- **k0**: 1B 1.111 / 1.107 at\n  128x128_c1x2_pp.")."""
    named = _named(task)
    out, fenced, passage = set(), False, []

    def close() -> None:
        body, starts = "", []
        for _, line in passage:
            starts.append(len(body))
            body += line.strip() + " "
        bounds = [*starts, len(body)]
        for m in _SENTENCE.finditer(body):
            if named.search(m.group(0)) and MEASUREMENT.search(m.group(0)):
                out.update(i for k, (i, _) in enumerate(passage) if bounds[k] < m.end() and m.start() < bounds[k + 1])
        passage.clear()

    for i, line in enumerate(text.splitlines()):
        if line.lstrip().startswith(("```", "~~~")):
            close()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not line.strip() or _ITEM.match(line) or _OWN_LINE.match(line):
            close()
        if line.strip():
            passage.append((i, line))
        if _OWN_LINE.match(line):
            close()
        if any(shape in line and config in line for shape, config in tuned.items()) \
                or (named.search(line) and MEASUREMENT.search(line)):
            out.add(i)
    close()
    return sorted(out)


def without_tuning(text: str, lines_out: list[int]) -> str:
    """The page with those lines (tuning_lines) replaced by TUNING_NOTE, the rest kept."""
    lines = text.splitlines(keepends=True)
    for i in lines_out:
        lines[i] = TUNING_NOTE + ("\n" if lines[i].endswith("\n") else "")
    return "".join(lines)


def cut_tuning(source: str, tuned: dict[str, str]) -> str:
    """An example's source without the TUNED lines that hold one of the task's (shape, config) pairs."""
    return "".join(line for line in source.splitlines(keepends=True)
                   if not any(shape in line and config in line for shape, config in tuned.items()))
