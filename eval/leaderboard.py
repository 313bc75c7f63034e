"""The leaderboard: tasks x tracks from Results (the store's and the shipped H200 and H100 ones), and
per backend and model from agent session logs.

A track is where a kernel came from: "expert" (human_kernels/), "generated:<backend>/<model>"
(an agent session's kernel), or "candidate" (any other file). Only Results that are
`ranked` (PASSED, timed on a GPU, not quarantined) enter the tables; quarantined
(IMPLAUSIBLE) and provisional (CPU-only) ones are listed apart. Of several ranked Results of
one task and track the best (lowest worst fused / GEMM-only) stands for the cell. Every
cell is of one precision (the Result's dtype, the one it was timed in) and one GPU model (its
machine's fingerprint): each GPU and precision present gets a table of its own, bfloat16
first, and a Result never stands beside or is compared with one of another precision or GPU.

Every number comes from a Result's ShapeTiming, i.e. from ratios taken repetition by
repetition within one interleaved run. Generated / expert is too where `epiforge compare`
timed both in one run (the shipped H200 Results were made that way); otherwise it is a
ratio of each run's fused / GEMM-only (each against its own run's speed of light), and is
labelled so.

    render_markdown(build(results, sessions))
"""

from __future__ import annotations

import ast
import hashlib
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from epiforge.eval.baselines import REPORTED
from epiforge.eval.result import NOT_THE_KERNELS_FAULT, Result
from epiforge.tasks import id_of, task_order
from epiforge.tasks.spec import PRECISIONS
from epiforge.eval.machine import DATA_DIR, REPO, expert_kernel  # noqa: F401 (REPO: for callers naming files relative to it)
from epiforge.text import counted

#: the H200 Results shipped with the repo, one file per run of the judge (each at one commit):
#: `epiforge compare --all --shapes paper` (lab/results/h200/compare-paper.md says how it was
#: made), then the tasks added after it, compared on their own (lab/results/h200/layer/);
#: lab/bench/compare_export.py writes them
SHIPPED = DATA_DIR / "h200-compare.jsonl"
SHIPPED_LATER = (DATA_DIR / "h200-compare-layer.jsonl",)
#: the H100's: `epiforge compare` of every task but the layer at the paper shapes, in two calls
#: into one store (lab/results/h100/compare-all/README.md)
SHIPPED_H100 = DATA_DIR / "h100-compare.jsonl"
SHIPPED_FILES = (SHIPPED, *SHIPPED_LATER, SHIPPED_H100)
#: the logs of the real LLM sessions whose kernels are in generated_kernels/ (logs/generated/README.md)
SHIPPED_SESSIONS = REPO / "logs" / "generated"
SHIPPED_SESSIONS_SOURCE = "the shipped sessions of real LLM agents: logs/generated"
BASELINE_COLUMNS = REPORTED
FAST_P = (1.0, 1.2, 1.5)


def gpu_of(r: Result) -> str:
    """The GPU a Result was timed on, as its machine's fingerprint names it."""
    return str(r.environment.get("gpu") or ("CPU" if r.device == "cpu" else "unnamed GPU"))


def track_of(r: Result) -> str:
    if r.track == "generated":
        return f"generated:{r.backend or '?'}/{r.model or '?'}"
    return r.track


def load_shipped_file(path: Path) -> list[Result]:
    """The Results of one shipped file (none if it is not there)."""
    if not path.is_file():
        return []
    return [Result.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


def load_shipped() -> list[Result]:
    """The Results shipped with the repo (SHIPPED_FILES), the compare --all run first."""
    return [r for path in SHIPPED_FILES for r in load_shipped_file(path)]


def describe_shipped() -> list[str]:
    """A source line for each shipped file (each is one run, one environment; "no results"
    where it is missing or empty)."""
    return [describe_source(load_shipped_file(path), f"shipped ({path.relative_to(REPO)})") for path in SHIPPED_FILES]


@dataclass
class Cell:
    task: str
    track: str
    result: Result  # the best ranked Result of this task and track

    @property
    def dtype(self) -> str:
        """The precision of the cell's timings (its Result's dtype)."""
        return self.result.dtype

    @property
    def gpu(self) -> str:
        """The GPU of the cell's timings: each GPU model's results stand apart."""
        return gpu_of(self.result)

    def shapes(self):
        return [s for s in self.result.per_shape if s.timing is not None and not s.hidden]

    @property
    def worst_over_sol(self) -> float:
        return max(s.timing.fused_over_gemm_only.median for s in self.shapes())

    def speedup_geomean(self, baseline: str) -> float | None:
        vals = [s.timing.speedup[baseline].median for s in self.shapes() if baseline in s.timing.speedup]
        return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None

    def over_expert_in_one_run(self) -> float | None:
        """This kernel's time / the expert kernel's, geomean over the shapes, where every
        shape timed the expert beside it (`epiforge compare`): per-repetition ratios of one run."""
        shapes = self.shapes()
        if not shapes or not all("kernel:expert" in s.timing.speedup for s in shapes):
            return None
        # speedup["kernel:expert"] is expert_i / this_i
        return 1.0 / self.speedup_geomean("kernel:expert")


@dataclass
class Board:
    cells: list[Cell] = field(default_factory=list)
    apart: list[tuple[str, Result]] = field(default_factory=list)  # (why, result): quarantined, provisional
    failed: list[Result] = field(default_factory=list)
    unsolved: dict[tuple[str, str, str, str], str] = field(default_factory=dict)  # (task, track, dtype, gpu) -> an outcome, nothing ranked
    sources: list[str] = field(default_factory=list)
    agents: list["AgentRow"] = field(default_factory=list)

    def tracks(self) -> list[str]:
        order = {"expert": 0, "candidate": 2}
        found = {c.track for c in self.cells} | {track for _, track, _, _ in self.unsolved}
        return sorted(found, key=lambda t: (order.get(t, 1), t))

    def dtypes(self) -> list[str]:
        """The precisions of the cells and unsolved rows, in the catalogue's order (bf16 first)."""
        found = {c.dtype for c in self.cells} | {dtype for _, _, dtype, _ in self.unsolved}
        return sorted(found, key=lambda d: (PRECISIONS.index(d) if d in PRECISIONS else len(PRECISIONS), d))

    def gpus(self) -> list[str]:
        """The GPUs of the cells and unsolved rows, by name (each gets tables of its own)."""
        return sorted({c.gpu for c in self.cells} | {gpu for _, _, _, gpu in self.unsolved})

    def cell(self, task: str, track: str, dtype: str = "bfloat16", gpu: str | None = None) -> Cell | None:
        """The cell of a task and track in one precision on one GPU (None: the first GPU, by
        name, that has one)."""
        return next((c for gpu_ in ([gpu] if gpu else self.gpus()) for c in self.cells
                     if (c.task, c.track, c.dtype, c.gpu) == (task, track, dtype, gpu_)), None)

    def fast_p(self, track: str, baseline: str, p: float, dtype: str = "bfloat16",
               gpu: str | None = None) -> tuple[int, int]:
        """(shapes of the track's correct cells in `dtype` on `gpu` (None: any) at least p times
        faster than the baseline, shapes of those cells timed against that baseline)."""
        hit = total = 0
        for c in self.cells:
            if c.track != track or c.dtype != dtype or gpu not in (None, c.gpu):
                continue
            for s in c.shapes():
                if baseline in s.timing.speedup:
                    total += 1
                    hit += s.timing.speedup[baseline].median >= p
        return hit, total


def build(results: list[Result], agents: list["AgentRow"] | None = None, sources: list[str] | None = None) -> Board:
    board = Board(sources=list(sources or []), agents=list(agents or []))
    best: dict[tuple[str, str, str, str], Result] = {}
    for r in results:
        if r.provisional:
            board.apart.append(("provisional: passed on the CPU emulator only", r))
        elif r.outcome.value == "IMPLAUSIBLE":
            board.apart.append(("quarantined: implausible timing", r))
        elif r.outcome in NOT_THE_KERNELS_FAULT:
            board.apart.append(("the task's own code failed, not the kernel: " + r.message[:120].replace("|", "/"), r))
        elif r.ranked:
            key = (r.task, track_of(r), r.dtype, gpu_of(r))
            if key not in best or _worst(r) < _worst(best[key]):
                best[key] = r
        else:
            board.failed.append(r)
    board.cells = [Cell(task, track, r) for (task, track, _, _), r in sorted(best.items())]
    for r in board.failed:
        board.unsolved.setdefault((r.task, track_of(r), r.dtype, gpu_of(r)), r.outcome.value)
    for key in best:
        board.unsolved.pop(key, None)
    return board


def _worst(r: Result) -> float:
    return max(s.timing.fused_over_gemm_only.median for s in r.per_shape if s.timing is not None)


# ---- agents ----------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """The unbiased pass@k estimator (Chen et al. 2021): 1 - C(n-c, k) / C(n, k); None when
    fewer than k sessions were run."""
    if n < k:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class AgentRow:
    """One backend and model over the agent sessions found."""

    backend: str
    model: str
    tasks: dict[str, tuple[int, int]]  # task -> (sessions, passed)
    solved: int = 0
    turns: int = 0
    tokens: int = 0
    usd: float | None = 0.0
    first_correct_s: list[float] = field(default_factory=list)
    #: task -> (turns, seconds) to its first PASSED evaluation, one pair per session that had one
    first_pass: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    @property
    def track(self) -> str:
        """The leaderboard track of this backend and model's kernels (track_of)."""
        return f"generated:{self.backend}/{self.model}"

    def pass_at(self, k: int) -> float | None:
        vals = [pass_at_k(n, c, k) for n, c in self.tasks.values()]
        vals = [v for v in vals if v is not None]
        return sum(vals) / len(vals) if vals else None


def agent_rows(log_dirs: list[Path]) -> list[AgentRow]:
    """Per backend and model: sessions and passes per task, and for the solved sessions the
    turns, tokens, dollars and the wall time to the first correct kernel."""
    from epiforge.agent.session import Evaluation, SessionStarted, read_events
    from epiforge.agent.sessions import counts_as_pass, last_end

    rows: dict[tuple[str, str], AgentRow] = {}
    seen: set[str] = set()  # a session's log in two folders (the user's, and a copy shipped) counts once
    for d in log_dirs:
        for path in sorted(Path(d).glob("*.jsonl")):
            try:
                events, _ = read_events(path)
            except Exception:  # not a session log
                continue
            start = next((e for e in events if isinstance(e, SessionStarted)), None)
            end = last_end(events)  # a resumed session: its last end
            ok = None if start is None else counts_as_pass(end)  # None: unfinished, not counted (the rule is there)
            if ok is None or start.replay_of is not None or start.session in seen:
                continue
            seen.add(start.session)
            key = (start.config.backend, start.config.model)
            row = rows.setdefault(key, AgentRow(backend=key[0], model=key[1], tasks={}))
            n, c = row.tasks.get(start.config.task, (0, 0))
            row.tasks[start.config.task] = (n + 1, c + ok)
            if ok:
                row.solved += 1
                row.turns += end.totals.turns
                row.tokens += end.totals.usage.total  # cache reads and writes too, as `sessions` counts them
                row.usd = None if row.usd is None or end.totals.cost_usd is None else row.usd + end.totals.cost_usd
                first = next((e for e in events if isinstance(e, Evaluation) and e.outcome == "PASSED"), None)
                if first is not None:
                    row.first_correct_s.append(_seconds_between(start.t, first.t))
                    # steps count model responses from 0: the first pass's turn is its step + 1
                    row.first_pass.setdefault(start.config.task, []).append(
                        (first.step + 1, _seconds_between(start.t, first.t)))
    return sorted(rows.values(), key=lambda r: (r.backend, r.model))


def _seconds_between(a: str, b: str) -> float:
    import datetime as dt

    return (dt.datetime.fromisoformat(b) - dt.datetime.fromisoformat(a)).total_seconds()


# ---- text ------------------------------------------------------------------------------------


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def render_markdown(board: Board) -> str:
    lines = ["# epiforge leaderboard", ""]
    for s in board.sources:
        lines.append(f"- {s}")
    if board.sources:
        lines.append("")
    if not board.cells and not board.unsolved:
        lines += ["No ranked results yet: a Result is ranked once it PASSED and was timed on a Hopper GPU "
                  "(`epiforge eval --device gpu --store FILE`, `epiforge compare`).", ""]
    else:
        for gpu in board.gpus():  # each GPU model's results apart: never one ratio across two
            for dtype in board.dtypes():
                lines += _tasks_table(board, dtype, gpu)
    lines += _agents_table(board)
    lines += _generated_tasks_table(board)
    if board.apart:
        lines += ["## Not ranked", "", "| task | track | outcome | why |", "|---|---|---|---|"]
        lines += [f"| {r.task} | {track_of(r)}{_in(r.dtype)} | {r.outcome.value} | {why} |" for why, r in board.apart]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _in(dtype: str) -> str:
    """ " (float16)" beside a row of any precision but the default one."""
    return "" if dtype == "bfloat16" else f" ({dtype})"


def _tasks_table(board: Board, dtype: str, gpu: str) -> list[str]:
    """The tasks x tracks table of the cells in one precision on one GPU, and its fast_p
    (nothing where that GPU has no row in that precision)."""
    cells = [c for c in board.cells if c.dtype == dtype and c.gpu == gpu]
    unsolved = {(t, track): why for (t, track, d, g), why in board.unsolved.items() if d == dtype and g == gpu}
    if not cells and not unsolved:
        return []
    present = [b for b in BASELINE_COLUMNS if any(c.speedup_geomean(b) is not None for c in cells)]
    shapes = []
    for c in cells:
        for s in c.shapes():
            if s.shape not in shapes:
                shapes.append(s.shape)
    header = ["task", "track", "correct", "fraction of the speed of light", *(f"x {b} (geomean)" for b in present),
              "generated / expert"]
    out = [f"## Tasks x tracks in {dtype} on {gpu} ({' / '.join(shapes) or 'nothing ranked'})", "",
           _md_row(*header), "|" + "---|" * len(header)]
    tasks = sorted({c.task for c in cells} | {t for t, _ in unsolved}, key=lambda t: task_order(id_of(t)))
    stale: list[str] = []
    for task in tasks:
        expert = board.cell(task, "expert", dtype, gpu)
        for track in ["expert", *(t for t in board.tracks() if t != "expert")]:  # an empty expert track shows too
            c = board.cell(task, track, dtype, gpu)
            if c is None:
                if track == "expert" and (task, track) not in unsolved and expert_kernel(task) is None:
                    out.append(_md_row(id_of(task), "expert", "none: the task has no expert kernel", "-",
                                       *("-" for _ in present), "-"))
                elif (task, track) in unsolved:
                    out.append(_md_row(id_of(task), track, f"no ({unsolved[task, track]})", "-",
                                       *("-" for _ in present), "-"))
                continue
            by_shape = {s.shape: s.timing for s in c.shapes()}
            if track == "expert" and not expert_is_current(c.result):
                stale.append(id_of(task))
                track = "expert (earlier version)"
            sol = " / ".join(_f(by_shape[s].fraction_of_speed_of_light) if s in by_shape else "-" for s in shapes)
            vs = [_f(c.speedup_geomean(b)) + "x" if c.speedup_geomean(b) is not None else "-" for b in present]
            ge = "-"
            if c.over_expert_in_one_run() is not None:
                ge = _f(c.over_expert_in_one_run(), "{:.3f}") + " (one run, geomean)"
            elif expert is not None and c is not expert:
                ge = _f(c.worst_over_sol / expert.worst_over_sol, "{:.3f}") + " (each run's speed of light)"
            out.append(_md_row(id_of(task), track, "yes", sol, *vs, ge))
    out.append("")
    out.append("fraction of the speed of light: GEMM-only time / the kernel's (1.00 = as fast as the plain GEMM). "
               "x baseline: how many times faster than it (median of per-repetition ratios, geometric mean over "
               "the shapes).")
    untimed = _untimed(tasks, dtype)
    if untimed:
        out.append("")
        out.append(f"Not timed here yet: {', '.join(untimed)} (catalogue tasks with an expert kernel and no result "
                   f"in {dtype} on {gpu} among these sources; `epiforge compare --task ID --device gpu` times one).")
    if stale:
        out.append("")
        out.append(f"expert (earlier version): {', '.join(stale)} were timed with an earlier version of today's "
                   "expert kernel (its sha256 differs from the file's now; `git log human_kernels/` says what changed).")
    quack = [id_of(t) for t in tasks if expert_author(t).startswith("quack library")]
    if quack:
        out.append("")
        out.append(f"Expert kernels that are quack's library epilogues: {', '.join(quack)}; the others are ours. "
                   "Where quack's convention differs from CODA v0.1's, the RoPE direction, k3 and k4 follow CODA and "
                   "their kernels adapt quack's epilogue, and k3hf and k4hf keep quack's (Hugging Face's). Every task "
                   "writes finished values where CODA's kernels write per-block partials, and ZdZ as a sum where CODA "
                   "takes a mean (README: conventions).")
    out.append("")
    fast = [(track, b, counts) for track in board.tracks() for b in present
            if (counts := [board.fast_p(track, b, p, dtype, gpu) for p in FAST_P])[0][1]]
    out += ["fast_p (shapes at least p times faster than the baseline / shapes timed against it):", ""]
    if fast:
        out += [_md_row("track", "baseline", *(f"p = {p}" for p in FAST_P)), "|---|---|" + "---|" * len(FAST_P)]
        out += [_md_row(track, b, *(f"{h}/{t}" for h, t in counts)) for track, b, counts in fast]
    else:
        out.append("none: no shape was timed against a baseline here.")
    out.append("")
    return out


def _md_row(*cells: str) -> str:
    """One Markdown table row: every cell its own column, so that no row can lose or gain one."""
    return "| " + " | ".join(cells) + " |"


def _untimed(listed: list[str], dtype: str) -> list[str]:
    """The ids of the catalogue's tasks that have an expert kernel and run in `dtype` but are
    not among the table's rows."""
    from epiforge.tasks import load_catalogue

    return [t.id for t in load_catalogue()[0]
            if t.name not in listed and dtype in t.dtypes and expert_kernel(t.name) is not None]


def _agents_table(board: Board) -> list[str]:
    if not board.agents:
        return ["## Agents", "", "No agent sessions found (`epiforge generate` writes them).", ""]
    out = ["## Agents", "", "| backend | model | tasks | sessions | pass@1 | pass@5 | turns / solved | tokens / solved "
           "| $ / solved | time to first correct (median) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for a in board.agents:
        n = sum(x for x, _ in a.tasks.values())
        per = (lambda v, fmt="{:.1f}": _f(v / a.solved, fmt) if a.solved else "-")
        usd = "-" if a.usd is None or not a.solved else f"{a.usd / a.solved:.3f}"
        med = _f(_median(a.first_correct_s), "{:.0f} s")
        out.append(f"| {a.backend} | {a.model} | {len(a.tasks)} | {n} | {_f(a.pass_at(1))} | {_f(a.pass_at(5))} | "
                   f"{per(a.turns)} | {per(a.tokens, '{:.0f}')} | {usd} | {med} |")
    out += ["", "pass@k: the unbiased estimator over each task's sessions, averaged over tasks ('-': fewer than k "
                "sessions).", ""]
    return out


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _over_expert_per_shape(c: Cell) -> str:
    """generated / expert at each timed shape, from the one interleaved run that timed both:
    the median of per-repetition ratios and its 95% bootstrap interval ("-" where the expert
    was not timed beside it)."""
    parts = []
    for s in c.shapes():
        r = s.timing.speedup.get("kernel:expert")  # expert_i / generated_i
        if r is None:
            return "-"
        interval = (f" [{1 / r.ci_high:.2f}, {1 / r.ci_low:.2f}]" if r.ci_low is not None and r.ci_high is not None
                    else "")
        parts.append(f"{s.shape} {1 / r.median:.2f}{interval}")
    return ", ".join(parts) or "-"


def _generated_tasks_table(board: Board) -> list[str]:
    """Per agent (backend and model) and task: pass@1 and pass@3 over its sessions, turns and
    wall time to the first pass, and generated / expert per shape on each GPU that timed the
    agent's kernel beside the expert."""
    agents = [a for a in board.agents if a.tasks]
    if not agents:
        return []
    out = ["## The generated track, per task", ""]
    for a in agents:
        gpus = [g for g in board.gpus() if g != "CPU" and any(board.cell(t, a.track, "bfloat16", g) for t in a.tasks)]
        header = ["task", "sessions", "passed", "pass@1", "pass@3", "turns to first pass (median)",
                  "wall to first pass (median)", *(f"generated / expert on {g} (bf16)" for g in gpus)]
        out += [f"Agent: {a.backend} / {a.model}", "", _md_row(*header), "|" + "---|" * len(header)]
        for task in sorted(a.tasks, key=lambda t: task_order(id_of(t))):
            n, c = a.tasks[task]
            firsts = a.first_pass.get(task, [])
            cells = [board.cell(task, a.track, "bfloat16", g) for g in gpus]
            out.append(_md_row(id_of(task), str(n), str(c), _f(pass_at_k(n, c, 1)), _f(pass_at_k(n, c, 3)),
                               _f(_median([t for t, _ in firsts]), "{:g}"), _f(_median([s for _, s in firsts]), "{:.0f} s"),
                               *("-" if cell is None else _over_expert_per_shape(cell) for cell in cells)))
        out.append("")
    out += ["pass@k: the unbiased estimator over the task's sessions ('-': fewer than k). generated / expert: at "
            "each timed shape, the median of per-repetition ratios of one interleaved run, with its 95% bootstrap "
            "interval (below 1: the generated kernel is faster), for the best of the agent's kernels of the task timed on "
            "that GPU (the one the tasks table shows: a best of several, as pass@k is); '-': not timed beside the "
            "expert on that GPU (a task without an expert kernel has none).", ""]
    return out


def describe_source(results: list[Result], where: str) -> str:
    """One line naming where results came from and their environment."""
    if not results:
        return f"{where}: no results"
    env = results[0].environment
    bits = [env.get("gpu"), f"driver {env['driver']}" if env.get("driver") else None,
            f"torch {env['torch']}" if env.get("torch") else None,
            f"quack {env['quack-kernels']}" if env.get("quack-kernels") else None,
            (env.get("date") or results[0].started_at or "")[:10] or None,
            f"commit {str(env['commit'])[:12]}" if env.get("commit") else None]
    return f"{where}: {counted(len(results), 'result')} ({', '.join(b for b in bits if b)})"


def expert_is_current(r: Result) -> bool:
    """Was this expert-track Result measured with the task's expert kernel as it is now?"""
    path = expert_kernel(r.task)
    return path is None or hashlib.sha256(path.read_bytes()).hexdigest() == r.kernel_sha256


def expert_author(task_name: str) -> str:
    """The AUTHOR constant of the task's expert kernel, read without importing it ("" if none)."""
    path = expert_kernel(task_name)
    if path is None:
        return ""
    for node in ast.parse(path.read_text()).body:
        if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["AUTHOR"]
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    return ""
