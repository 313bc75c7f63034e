"""compare(): several kernels of one task (the expert one, generated ones, files) judged
together, and on a GPU timed in ONE interleaved run per shape, so that generated / expert
is a ratio taken repetition by repetition (eval/gpu_stages.py, run_timed_stages).

On a CPU nothing is timed: each kernel's numerics (and, with compile, its sm_90a build)
are judged; the timing columns say why they are empty.

    select_kernels("k8", ["expert", "generated:backend=anthropic"])  -> [(label, path)]
    compare("k8", kernels, device="gpu", shapes="paper")              -> Comparison
    compare_all([("k1", k1_kernels), ("k8", kernels)], device="gpu", shapes="paper")
                                     -> [Comparison, ...], every task judged by one judge process
"""

from __future__ import annotations

import hashlib
import platform
import secrets
import time
from pathlib import Path

from pydantic import BaseModel, Field

from epiforge.eval.evaluation import DEFAULT_TIMEOUT_S, check_arguments, pick_dtypes, static_stage
from epiforge.eval.isolation import run_judge
from epiforge.eval.kernel import HUMAN_DIR, KernelError, expert_kernel, generated_kernels, read_kernel, resolve_kernel
from epiforge.eval.result import Outcome, RatioStat, Result
from epiforge.tasks import get_task

#: how a generated kernel may be selected: generated, generated:<ID>, generated:<field>=<value>
SELECTABLE = ("session", "backend", "model")


class Comparison(BaseModel):
    """The Results of one compare() run, in the order the kernels were given."""

    task: str
    device: str
    shapes: str
    labels: list[str] = Field(description="one per Result: expert, generated:<ID> or the file's name")
    results: list[Result]

    def by_label(self, label: str) -> Result | None:
        return next((r for lab, r in zip(self.labels, self.results) if lab == label), None)

    def versus(self, label: str, other: str, shape: str, dtype: str | None = None) -> RatioStat | None:
        """label's time / other's at `shape` in `dtype` (default: label's Result's), repetition by
        repetition in the one run. None: not timed there, or the two Results are keyed on
        different precisions (a bf16 row is never paired with an fp16 one)."""
        r, o = self.by_label(label), self.by_label(other)
        if r is None or o is None or r.dtype != o.dtype:
            return None
        want = dtype or r.dtype
        s = next((s for s in r.per_shape if s.shape == shape and s.dtype == want and s.timing), None)
        stat = s.timing.speedup.get(f"kernel:{other}") if s else None  # other_i / label_i
        if stat is None:
            return None
        inv = [1 / x if x is not None else None for x in (stat.median, stat.q3, stat.q1, stat.ci_high, stat.ci_low)]
        return RatioStat(median=inv[0], q1=inv[1], q3=inv[2], ci_low=inv[3], ci_high=inv[4])


def select_kernels(task_name: str, specs: list[str], *, one_of_several: bool = False) -> list[tuple[str, Path]]:
    """(label, path) for each spec: "expert" (none when the task has no expert kernel);
    "generated" (every generated kernel of the task: the committed track's and the user's,
    eval.kernel.generated_kernels), "generated:<ID>",
    "generated:backend=<b>" / model= / session=; a path. ValueError if none is left, or if a
    "generated:..." filter matches none of this task's kernels, unless the task is
    `one_of_several` judged together (the caller then checks that the filter matched in one)."""
    task = get_task(task_name)
    out: list[tuple[str, Path]] = []
    empty = ""
    for spec in specs:
        if spec in ("expert", "human"):
            if expert_kernel(task.name) is None:  # an empty expert track: nothing to add
                empty = f": {task.name} has no expert kernel (no {HUMAN_DIR.name}/{task.name}.py), its expert track is empty"
                continue
            out.append(("expert", resolve_kernel("human", task.name)))
        elif spec == "generated" or spec.startswith("generated:"):
            want = spec.partition(":")[2]
            found = generated_kernels(task.name)
            picked = []
            for path in found:
                if not want:
                    picked.append(path)
                elif "=" in want:
                    key, _, value = want.partition("=")
                    if key not in SELECTABLE:
                        raise ValueError(f"--kernels {spec}: select generated kernels by {', '.join(SELECTABLE)}")
                    try:
                        meta = read_kernel(path)
                    except KernelError:
                        continue
                    if getattr(meta, key) == value:
                        picked.append(path)
                elif path.stem == want:
                    picked.append(path)
            if not picked and spec != "generated" and not one_of_several:
                raise ValueError(f"--kernels {spec}: no generated kernel of {task.name} matches")
            out += [(f"generated:{p.stem}", p) for p in picked]
        else:
            path = Path(spec)
            if not path.is_file():
                raise KernelError(f"--kernels {spec}: no kernel file there")
            out.append((path.stem, path))
    labels = [label for label, _ in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--kernels: two kernels would share a label ({labels})")
    if not out:
        raise ValueError(f"no kernels to compare for {task.name}{empty}")
    return out


class _Plan:
    """One task of a compare run: its kernels, the Results settled before the judge (the
    static stage's rejections), the kernels the judge gets and the judge's job for them."""

    def __init__(self, task: str, kernels: list[tuple[str, Path]], device: str, shapes: str):
        self.task, self.kernels, self.device, self.shapes = task, kernels, device, shapes
        self.results: dict[str, Result] = {}
        self.judged: list[dict] = []
        self.job: dict | None = None

    @property
    def settled(self) -> bool:
        return all(label in self.results for label, _ in self.kernels)

    def settle(self, raw: dict, wall_s: float) -> None:
        """The Results in the judge's {"results": [...]} for this task."""
        for k, r in zip(self.judged, raw["results"]):
            self.results[k["label"]] = Result.model_validate(r).model_copy(update={"wall_s": wall_s})

    def lost(self, run, stage: str, wall_s: float) -> None:
        """A failure Result per judged kernel: the judge ended without this task's verdict."""
        why = "timed out" if run.timed_out else (run.broken or run.signal_name or f"exit code {run.returncode}")
        for k in self.judged:
            self.results[k["label"]] = Result.stopped(
                {**k["base"], "device": self.device, "shapes": self.shapes},
                Outcome.TIMEOUT if run.timed_out else Outcome.RUNTIME_ERROR, stage,
                f"the judge ended without a verdict ({why}) during {stage}", stderr_tail=run.stderr_tail, wall_s=wall_s)

    def comparison(self) -> Comparison:
        labels = [label for label, _ in self.kernels]
        return Comparison(task=self.task, device=self.device, shapes=self.shapes, labels=labels,
                          results=[self.results[x] for x in labels])


def compare(task_name: str, kernels: list[tuple[str, Path]], **kw) -> Comparison:
    """Judge the kernels of one task together (see the module docstring); keywords as
    compare_all's, on_stage(stage)."""
    hear = kw.pop("on_stage", None)
    return compare_all([(task_name, kernels)], on_stage=None if hear is None else (lambda task, st: hear(st)),
                       **kw)[0]


def compare_all(plans: list[tuple[str, list[tuple[str, Path]]]], *, device: str = "cpu", shapes: str = "smoke",
                seed: int | None = None, timeout_s: float | None = None, compile: bool = False, reps: int = 30,
                baselines: list[str] = (), dtype=None, on_stage=None, on_done=None,
                launcher: bool | frozenset[str] = True) -> list[Comparison]:
    """compare() of several tasks, [(task, kernels)], judged one after another by ONE judge
    process (eval/judge.py, a job per task): what every judge pays once (CUDA, cuBLAS,
    Inductor's, Liger's and quack's first builds) is paid once. The static stage runs
    here, per kernel, on each source read once. baselines: registry names
    (eval/baselines.py) timed beside the standard ones on a GPU. dtype: as evaluate's
    (eval.evaluation.pick_dtypes), for every task. on_stage(task, stage)
    hears each stage; on_done(Comparison) gets each task's as soon as it is settled, in
    the order given. launcher: True (the default) judges every kernel in the launcher mode
    (eval.evaluation.evaluate's), False every kernel in its own process, a set of labels
    only those kernels in the launcher mode (one kernel under both modes in one
    interleaved run: lab/bench/launcher_overhead.py). A judge that ends without a verdict (it crashed, or ran out of time)
    costs that one task its verdict: the tasks after it go to a new judge."""
    from epiforge.eval.baselines import REGISTRY

    unknown = [b for b in baselines if b not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; known: {', '.join(REGISTRY)}")
    runner_env = {"EPIFORGE_CROSS_COMPILE": "1", "CUTE_DSL_ARCH": "sm_90a", "QUACK_ARCH": "90"} \
        if compile and device == "cpu" else {}
    todo = []
    for task_name, kernels in plans:
        dev, task = check_arguments(task_name, device, shapes)
        dtypes = pick_dtypes(task, dtype)
        plan = _Plan(task.name, kernels, dev, shapes)
        for label, path in kernels:
            source = path.read_bytes()
            base = dict(task=task.name, kernel=str(path), kernel_sha256=hashlib.sha256(source).hexdigest(),
                        device=dev, shapes=shapes, dtypes=dtypes, environment={"python": platform.python_version()})
            text = source.decode(errors="replace")
            early = static_stage(task, path, text, base, True)
            if isinstance(early, Result):
                plan.results[label] = early
            else:
                plan.judged.append({"label": label, "source": text,
                                    "launcher": launcher is True or (launcher is not False and label in launcher),
                                    "base": {k: v for k, v in {**early, "track": early.get("track", "candidate")}.items()
                                             if k != "environment"}})
        if plan.judged:
            plan.job = {"task": task.name, "device": dev, "shapes": shapes, "kernels": plan.judged,
                        "seed": secrets.randbelow(2**31) if seed is None else int(seed), "reps": int(reps),
                        "memory_limit_gib": 16, "hidden_shapes": True, "timing": True, "runner_env": runner_env,
                        "baselines": list(baselines), "dtypes": dtypes,
                        "timeout_s": float(timeout_s or DEFAULT_TIMEOUT_S[dev] * len(plan.judged))}
        todo.append(plan)
    shown = 0

    def show_ready() -> None:  # each settled task, in order
        nonlocal shown
        while shown < len(todo) and todo[shown].settled:
            if on_done is not None:
                on_done(todo[shown].comparison())
            shown += 1

    show_ready()
    waiting = [p for p in todo if p.job is not None]
    while waiting:
        began = {0: time.monotonic()}  # per job, when the harness first heard of it: its wall time's start

        def hear(j: int, stage: str) -> None:
            began.setdefault(j, time.monotonic())
            if on_stage is not None:
                on_stage(waiting[j].task, stage)

        def heard_result(j: int, raw: dict) -> None:
            waiting[j].settle(raw, round(time.monotonic() - began.get(j, began[0]), 3))
            show_ready()

        run = run_judge({"jobs": [p.job for p in waiting]}, timeout_s=sum(p.job["timeout_s"] for p in waiting),
                        on_stage=hear, on_result=heard_result)
        for j, p in enumerate(waiting):
            if j in run.results and not p.settled:
                p.settle(run.results[j], round(time.monotonic() - began.get(j, began[0]), 3))
        late = [j for j in range(len(waiting)) if j not in run.results]
        if not late:
            break
        # the judge ended inside this job: it loses its verdict, the jobs after it get a new judge
        first = late[0]
        waiting[first].lost(run, run.stage_of(first), round(time.monotonic() - began.get(first, began[0]), 3))
        show_ready()
        waiting = waiting[first + 1:]
    show_ready()
    return [p.comparison() for p in todo]
