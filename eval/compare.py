"""compare(): several kernels of one task (the expert one, generated ones, files) judged
together, and on a GPU timed in ONE interleaved run per shape, so that generated / expert
is a ratio taken repetition by repetition (eval/gpu_stages.py, run_timed_stages).

On a CPU nothing is timed: each kernel's numerics (and, with compile, its sm_90a build)
are judged; the timing columns say why they are empty.

    select_kernels("k8", ["expert", "generated:backend=anthropic"])  -> [(label, path)]
    compare("k8", kernels, device="gpu", shapes="paper")              -> Comparison
"""

from __future__ import annotations

import hashlib
import platform
import secrets
from pathlib import Path

from pydantic import BaseModel, Field

from epiforge.eval.evaluation import DEFAULT_TIMEOUT_S, check_arguments, static_stage
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

    def versus(self, label: str, other: str, shape: str) -> RatioStat | None:
        """label's time / other's, repetition by repetition in the one run (None: not timed)."""
        r = self.by_label(label)
        s = next((s for s in (r.per_shape if r else []) if s.shape == shape and s.timing), None)
        stat = s.timing.speedup.get(f"kernel:{other}") if s else None  # other_i / label_i
        if stat is None:
            return None
        inv = [1 / x if x is not None else None for x in (stat.median, stat.q3, stat.q1, stat.ci_high, stat.ci_low)]
        return RatioStat(median=inv[0], q1=inv[1], q3=inv[2], ci_low=inv[3], ci_high=inv[4])


def select_kernels(task_name: str, specs: list[str]) -> list[tuple[str, Path]]:
    """(label, path) for each spec: "expert" (none when the task has no expert kernel);
    "generated" (every generated kernel of the task: the committed track's and the user's,
    eval.kernel.generated_kernels), "generated:<ID>",
    "generated:backend=<b>" / model= / session=; a path. ValueError if none is left."""
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
            if not picked and spec != "generated":
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


def compare(task_name: str, kernels: list[tuple[str, Path]], *, device: str = "cpu", shapes: str = "smoke",
            seed: int | None = None, timeout_s: float | None = None, compile: bool = False, reps: int = 30,
            baselines: list[str] = (), on_stage=None) -> Comparison:
    """Judge the kernels together (see the module docstring); the static stage runs here,
    per kernel, on each source read once. baselines: registry names (eval/baselines.py)
    timed beside the standard ones on a GPU."""
    from epiforge.eval.baselines import REGISTRY

    device, task = check_arguments(task_name, device, shapes)
    unknown = [b for b in baselines if b not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; known: {', '.join(REGISTRY)}")
    results: dict[str, Result] = {}
    judged = []
    for label, path in kernels:
        source = path.read_bytes()
        base = dict(task=task.name, kernel=str(path), kernel_sha256=hashlib.sha256(source).hexdigest(),
                    device=device, shapes=shapes, environment={"python": platform.python_version()})
        text = source.decode(errors="replace")
        early = static_stage(task, path, text, base, True)
        if isinstance(early, Result):
            results[label] = early
        else:
            judged.append({"label": label, "source": text,
                           "base": {k: v for k, v in {**early, "track": early.get("track", "candidate")}.items()
                                    if k != "environment"}})
    if judged:
        timeout = float(timeout_s or DEFAULT_TIMEOUT_S[device] * len(judged))
        runner_env = {"EPIFORGE_CROSS_COMPILE": "1", "CUTE_DSL_ARCH": "sm_90a", "QUACK_ARCH": "90"} \
            if compile and device == "cpu" else {}
        request = {"task": task.name, "device": device, "shapes": shapes, "kernels": judged,
                   "seed": secrets.randbelow(2**31) if seed is None else int(seed), "reps": int(reps),
                   "memory_limit_gib": 16, "hidden_shapes": True, "timing": True, "runner_env": runner_env,
                   "baselines": list(baselines)}
        run = run_judge(request, timeout_s=timeout, on_stage=on_stage)
        if run.result is not None and run.broken is None:
            for k, raw in zip(judged, run.result["results"]):
                results[k["label"]] = Result.model_validate(raw).model_copy(update={"wall_s": run.wall_s})
        else:
            why = "timed out" if run.timed_out else (run.broken or run.signal_name or f"exit code {run.returncode}")
            for k in judged:
                results[k["label"]] = Result(**{**k["base"], "device": device, "shapes": shapes}, outcome=(
                    Outcome.TIMEOUT if run.timed_out else Outcome.RUNTIME_ERROR), stage=run.stage,
                    message=f"the judge ended without a verdict ({why}) during {run.stage}",
                    stderr_tail=run.stderr_tail, wall_s=run.wall_s)
    labels = [label for label, _ in kernels]
    return Comparison(task=task.name, device=device, shapes=shapes, labels=labels, results=[results[x] for x in labels])
