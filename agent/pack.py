"""The knowledge pack: what the model reads. Pages are discovered under primitive_docs/
(every *.md; only index.md is named here), expert kernels of the OTHER tasks are the
examples, and the prompts are rendered with jinja2 from agent/templates/.

Pages whose path names the session's own task (e.g. an implementation log of k8 while
solving k8), or that quote a kernel file of it (`TASK = "<task>"`), are withheld: they
would hand the model the answer. Then what the task's expert holds, found by machine
(agent/answers.py): an example or code block with one of its epilogues (the same graph, or
the same quack library epilogue) is withheld, a page's lines measuring the task are
replaced by a note, and an example's TUNED lines of its (shape, config) pairs are cut. Then the content rule
(agent/screen.py) on what is left: any code block or example kernel that, adapted to the
task by a trivial edit, passes the task's check is withheld too (a block replaced by a
note, an example dropped), each with its reason. `without` removes pages for ablations. The pack's hash identifies exactly what the
model could read.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

from epiforge.eval.kernel import HUMAN_DIR, REPO
from epiforge.tasks import id_of, task_order  # noqa: F401 (task_order: re-exported for agent/tools.py)

DOCS_DIR = REPO / "primitive_docs"
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
#: the pages embedded in the system prompt stop at this many characters; the rest stay readable with read_doc
PROMPT_DOC_CHARS = 120_000
PROMPT_EXAMPLES = 2


class PackError(ValueError):
    """A pack that cannot be built as asked (one line)."""


@dataclass(frozen=True)
class Doc:
    name: str  # path under primitive_docs/ without .md, e.g. "index", "operands", "logs/k0"
    text: str

    @property
    def kind(self) -> str:
        return "index" if self.name == "index" else "log" if self.name.startswith("logs/") else "page"

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:12]


@dataclass
class Pack:
    task: object  # tasks.Task
    docs: list[Doc]
    examples: dict[str, str]  # other task's name -> expert kernel source
    without: list[str] = field(default_factory=list)
    withheld: list[str] = field(default_factory=list)
    withheld_code: list[dict] = field(default_factory=list)  # {"where", "why"}: agent/screen.py
    unscreened: str | None = None  # why screening stopped short (build_pack's `watch`); the rest is withheld

    # ---- lookups used by the tools ---------------------------------------------------

    def doc(self, name: str) -> Doc | None:
        name = name.strip().removesuffix(".md").removeprefix("primitive_docs/")
        for d in self.docs:
            if d.name == name:
                return d
        stems = [d for d in self.docs if d.name.rsplit("/", 1)[-1] == name]
        return stems[0] if len(stems) == 1 else None

    def example(self, name: str) -> tuple[str, str] | None:
        """An example by task name or id ('k2' or 'k2_gemm_rmsnorm_swiglu')."""
        for task_name, source in self.examples.items():
            if name in (task_name, id_of(task_name), task_name + ".py"):
                return task_name, source
        return None

    # ---- what goes into the prompt ---------------------------------------------------

    def prompt_docs(self) -> tuple[list[Doc], list[Doc]]:
        """(pages embedded in the system prompt, pages left to read_doc): index first, then
        the pages most related to the task, then implementation logs, within PROMPT_DOC_CHARS."""
        words = _task_words(self.task)
        ranked = sorted(self.docs, key=lambda d: ({"index": 0, "page": 1, "log": 2}[d.kind], -_relevance(d, words), d.name))
        inside, outside, used = [], [], 0
        for d in ranked:
            if used + len(d.text) <= PROMPT_DOC_CHARS:
                inside.append(d)
                used += len(d.text)
            else:
                outside.append(d)
        return inside, outside

    def prompt_examples(self) -> list[tuple[str, str]]:
        words = _task_words(self.task)
        ranked = sorted(self.examples.items(), key=lambda kv: (-len(words & set(kv[0].split("_")[1:])), task_order(kv[0])))
        return ranked[:PROMPT_EXAMPLES]

    def info(self):
        from epiforge.agent.session import PackInfo

        inside, _ = self.prompt_docs()
        return PackInfo(sha256=self.sha256, docs={d.name: d.sha for d in self.docs}, in_prompt=[d.name for d in inside],
                        examples=sorted(self.examples, key=task_order), without=list(self.without),
                        withheld=list(self.withheld), withheld_code=[dict(w) for w in self.withheld_code],
                        unscreened=self.unscreened)

    @property
    def sha256(self) -> str:
        blob = {
            "docs": {d.name: d.sha for d in self.docs},
            "examples": {k: hashlib.sha256(v.encode()).hexdigest()[:12] for k, v in self.examples.items()},
            "templates": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:12] for p in sorted(TEMPLATES_DIR.glob("*.j2"))},
        }
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()

    # ---- rendering ---------------------------------------------------------------------

    def render(self, template: str, **extra) -> str:
        inside, outside = self.prompt_docs()
        return _env().get_template(template).render(
            task=self.task, inputs=self.task.inputs, outputs=self.task.outputs, scalars=self.task.scalars,
            docs=inside, more_docs=outside, all_docs=self.docs, examples=self.prompt_examples(),
            other_examples=sorted(self.examples, key=task_order), stub=kernel_stub(self.task),
            finishers=_finishers(self.task), smoke=_smoke_dims(), timed=_timed_shapes(self.task), dtype_shown=lambda t: dtype_shown(self.task, t),
            **extra,
        ).strip() + "\n"

    def system_prompt(self, **extra) -> str:
        return self.render("system.md.j2", **extra)

    def task_prompt(self, **extra) -> str:
        return self.render("task.md.j2", **extra)


def build_pack(task, docs_dir: Path | None = None, without: list[str] | tuple[str, ...] = (), *,
               screen_cache: Path | None = None, watch: Callable[[int, int], str | None] | None = None,
               expert: Path | None = None) -> Pack:
    """Discover the pages and examples for `task`; `without` names pages to leave out (by
    name, e.g. "operands" or "logs/k0", or by file name); an unknown name is an error.
    Code that would pass the task's check is withheld (agent/screen.py); `screen_cache`:
    where new verdicts are written (default: the user cache). `watch(done, total)` is asked
    before each verdict (done of the total in so far): None goes on; a reason stops the
    screening there, and every candidate not screened yet is withheld (Pack.unscreened).
    `expert`: the kernel whose epilogues and tuning the pack must not hold (default: the
    task's expert kernel, human_kernels/<task>.py)."""
    docs_dir = Path(docs_dir or DOCS_DIR)
    docs = [Doc(p.relative_to(docs_dir).with_suffix("").as_posix(), p.read_text(encoding="utf-8"))
            for p in sorted(docs_dir.rglob("*.md"))] if docs_dir.is_dir() else []
    removed = set()
    for want in without:
        key = want.strip().removesuffix(".md").removeprefix("primitive_docs/")
        hits = [d.name for d in docs if d.name == key or d.name.rsplit("/", 1)[-1] == key]
        if len(hits) != 1:
            known = ", ".join(d.name for d in docs) or "(none)"
            why = "matches no page" if not hits else f"is ambiguous ({', '.join(hits)})"
            raise PackError(f"--pack-without {want!r} {why}; pages: {known}")
        removed.add(hits[0])
    own = re.compile(rf"(^|[/_.-]){re.escape(task.id)}([/_.-]|$)|{re.escape(task.name)}")
    own_kernel = re.compile(rf"TASK\s*=\s*[\"']{re.escape(task.name)}[\"']")  # a page quoting the task's kernel file
    withheld = [d.name for d in docs if (own.search(d.name) or own_kernel.search(d.text)) and d.name not in removed]
    kept = [d for d in docs if d.name not in removed and d.name not in withheld]
    examples = {p.stem: p.read_text(encoding="utf-8") for p in sorted(HUMAN_DIR.glob("*.py"))
                if p.stem not in (task.name, "__init__")}
    # the expert's epilogues and tuning out first (agent/answers.py), so that the screen judges what the model reads
    kept, examples, answer_code = without_answers(task, kept, examples, expert)
    kept, examples, withheld_code, unscreened = _screen(task, kept, examples, screen_cache, watch)
    withheld_code = answer_code + withheld_code
    return Pack(task=task, docs=kept, examples=examples, without=sorted(removed), withheld=withheld,
                withheld_code=withheld_code, unscreened=unscreened)


def _screen(task, docs: list[Doc], examples: dict[str, str], cache: Path | None, watch):
    """The content rule (agent/screen.py): every code block and example that, adapted to
    the task by a trivial edit, passes the task's check is withheld: a block is replaced
    by a note in its page, an example dropped. Once `watch` stops the screening, every
    candidate left is withheld unscreened."""
    from epiforge.agent import screen

    blocks = {d.name: screen.code_blocks(d.text) for d in docs}
    total, done, stopped = sum(map(len, blocks.values())) + len(examples), 0, None

    def verdict(judge, src: str) -> str | None:
        nonlocal done, stopped
        if stopped is None and watch is not None:
            stopped = watch(done, total)
        if stopped:
            return f"not screened: {stopped}"
        done += 1
        return judge(task, src, write_to=cache)

    out_docs, withheld = [], []
    for d in docs:
        text, parts, at = d.text, [], 0
        for i, m in enumerate(blocks[d.name], 1):
            why = verdict(screen.screen_block, m.group("body"))
            if why:
                where = f"page {d.name}, code block {i}"
                parts += [text[at:m.start()], f"[code example withheld for this task: {where} was not screened]\n"
                          if stopped else screen.note(where)]
                at = m.end()
                withheld.append({"where": where, "why": why})
        out_docs.append(Doc(d.name, "".join(parts) + text[at:]) if parts else d)
    kept = {}
    for name, source in examples.items():
        why = verdict(screen.screen_example, source)
        if why:
            withheld.append({"where": f"example {name}", "why": why})
        else:
            kept[name] = source
    return out_docs, kept, withheld, stopped


def without_answers(task, docs: list[Doc], examples: dict[str, str], expert: Path | None):
    """The pack less what holds the expert's epilogues or tuning (agent/answers.py):
    (docs, examples, what was withheld as {"where", "why"})."""
    from epiforge.agent import answers, screen

    epilogues, tuned = answers.expert_answers(task, expert)
    code, out_docs = [], []
    for d in docs:
        lines = answers.tuning_lines(task, d.text, tuned) if tuned else []
        if lines:
            code.append({"where": f"page {d.name}", "why": f"{len(lines)} line(s) measuring the task's kernel replaced "
                                                          "by a note"})
            d = Doc(d.name, answers.without_tuning(d.text, lines))
        text, parts, at = d.text, [], 0
        for i, m in enumerate(screen.code_blocks(text), 1):
            if epilogues & answers.keys(m.group("body")):
                where = f"page {d.name}, code block {i}"
                parts += [text[at:m.start()], screen.note(where)]
                at = m.end()
                code.append({"where": where, "why": "it defines an epilogue of the task's expert kernel (the same graph)"})
        out_docs.append(Doc(d.name, "".join(parts) + text[at:]) if parts else d)
    kept = {}
    for name, source in examples.items():
        if epilogues & answers.keys(source):
            code.append({"where": f"example {name}", "why": "it holds an epilogue of the task's expert kernel (the same "
                                                             "graph, or the same quack library epilogue)"})
            continue
        cut = answers.cut_tuning(source, tuned)
        if cut != source:
            code.append({"where": f"example {name}", "why": "its TUNED lines of the task's own (shape, config) pairs cut"})
        kept[name] = cut
    return out_docs, kept, code


def dtype_shown(task, spec) -> str:
    """A tensor's dtype as the prompt names it: a fixed one as it is; a `precision` one as
    the precisions it is judged in (every one the task lists, by default)."""
    if not spec.follows_precision:
        return spec.dtype
    if len(task.dtypes) == 1:
        return f"precision ({task.dtypes[0]})"
    return f"precision (each of {' and '.join(task.dtypes)}: the kernel is judged in every one)"


def kernel_stub(task) -> str:
    """The file the model starts from (and the command backend's kernel.py)."""
    return _env().get_template("kernel_stub.py.j2").render(task=task).strip() + "\n"


@lru_cache(maxsize=1)
def _env():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def _task_words(task) -> set[str]:
    return set(task.name.split("_")[1:]) - {"gemm", "partial"}


def _relevance(doc: Doc, words: set[str]) -> int:
    name_hits = sum(3 for w in words if w in doc.name.lower())
    text = doc.text.lower()
    return name_hits + sum(min(text.count(w), 5) for w in words)


def _finishers(task) -> dict[str, str]:
    from epiforge.primitives.finish import FINISHERS

    return {name: FINISHERS[name] for name in task.finishing_steps}


def _timed_shapes(task) -> list[dict]:
    """The paper shapes a GPU times, each with its dims and the task's GEMMs as TUNED keys
    ("MxNxK", each distinct GEMM once)."""
    from epiforge import tasks

    out = []
    for s in tasks.shape_sets()["paper"]:
        dims = s.dims()
        keys = list(dict.fromkeys(f"{m}x{n}x{k}" for m, n, k in task.gemm_shapes(dims)))
        out.append({"name": s.name, "M": dims["M"], "d": dims["d"], "F": dims["F"], "V": dims["V"], "gemms": keys})
    return out


def _smoke_dims() -> list[dict]:
    from epiforge import tasks

    return [s.dims() | {"name": s.name} for s in tasks.shape_sets()["smoke"]]
