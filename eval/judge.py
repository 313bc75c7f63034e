"""The judge: a trusted process, out of the candidate's reach, for one evaluation or for
several tasks judged one after another (compare --all: {"jobs": [request, ...]}).

    python -m epiforge.eval.judge --result-fd N --tmp DIR   < request.json    (started by evaluate(), compare())

It holds what decides the verdict: the secret seed, the task's references, the tolerance,
the expected outputs and the timings of the baselines. It is non-dumpable (no process of
its user can read or write its memory) and starts the candidate in a runner process of
its own (eval/runner.py, via eval/remote.py), which sees only inputs and output buffers.

Stages (after the harness's static stage on the source, eval/evaluation.py): load ->
compile -> numerics at every shape -> on a GPU, per named shape: launches -> benchmark ->
recheck -> plausibility -> done. The named shapes are followed by hidden shapes drawn from
the seed (eval/secret_shapes.py), checked for numerics only, whose dims are never
reported. Nothing is timed until every shape's numerics passed, so a rejected kernel never
shows a speed.

The channel to the harness: newline-delimited JSON frames on an inherited pipe, each
with the nonce the harness sent (and, for several jobs, the job's index); progress
{"stage": ...} and one {"result": ...} per job ({"results": [eval.result.Result, ...]},
one per kernel). The runners never hold this pipe. Several jobs in one process pay once
what each process pays on its first task: on the H200 (lab/results/h200/build-costs/)
the first references, Liger, FlashInfer and torch.compile builds of a process took ~19 s,
the same builds for a later task well under 1 s each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

#: spare runners forked first thing (eval/runner.py fork_spares, SPARES_PER_JUDGE of them),
#: before the judge imports its own modules or reads the request (a judge forked by a warm
#: zygote does the same: eval/judge_zygote.py). EPIFORGE_RUNNER_SPARES=0: none, each runner a
#: new process.
if __name__ == "__main__" and os.environ.get("EPIFORGE_RUNNER_SPARES") != "0":
    from epiforge.eval.runner import fork_spares

    fork_spares()

from epiforge.eval.isolation import make_undumpable, setup_child  # noqa: E402
from epiforge.eval.machine import fingerprint  # noqa: E402
from epiforge.eval.result import Outcome, Result, ShapeResult  # noqa: E402

#: this module's import (or, in a judge forked by a warm zygote, its fork): the judge's own
#: startup counts in its first stage
_STARTED = time.monotonic()

_RUNNERS: list = []  # the live KernelProcesses, for the SIGTERM handler
_TMP = None


class Channel:
    """The pipe to the harness; `job` (None: a one-job request) goes on every frame."""

    def __init__(self, fd: int, nonce: str):
        self.fd, self.nonce, self.job = fd, nonce, None

    def send(self, **frame) -> None:
        job = {} if self.job is None else {"job": self.job}
        data = (json.dumps({"nonce": self.nonce, **job, **frame}) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def stage(self, name: str) -> None:
        self.send(stage=name)


class Stopwatch:
    """Seconds per stage of one judge run (Result.stage_s), shared by its candidates."""

    def __init__(self, first: str, since: float):
        self.spent: dict[str, float] = {}
        self.stage, self.since = first, since

    def enter(self, stage: str) -> None:
        now = time.monotonic()
        self.spent[self.stage] = self.spent.get(self.stage, 0.0) + now - self.since
        self.stage, self.since = stage, now

    def so_far(self) -> dict[str, float]:
        spent = {**self.spent, self.stage: self.spent.get(self.stage, 0.0) + time.monotonic() - self.since}
        return {k: round(v, 3) for k, v in spent.items()}


class Candidate:
    """One kernel under judgement: its runner, its shapes so far, and once it ends, its Result."""

    def __init__(self, label: str, source: str, base: dict, clock: Stopwatch, launcher: bool = False):
        self.label, self.source, self.base = label, source, {**base, "environment": {}}
        self.launcher = launcher  # the judge's launcher mode for this kernel (eval.evaluation.evaluate)
        self.clock = clock
        self.kp = None
        self.per_shape: list[ShapeResult] = []
        self.result: Result | None = None
        self.stage = "load"

    @property
    def live(self) -> bool:
        return self.result is None

    def finish(self, outcome: Outcome, message: str) -> None:
        stderr = self.kp.stderr_tail() if self.kp else ""
        if self.per_shape and self.per_shape[-1].hidden and outcome != Outcome.PASSED:
            # what the kernel's process wrote may spell the hidden shape's sizes, in digits or not
            stderr = "(withheld: the kernel's process wrote this at a hidden shape)"
        self.result = Result.judged(self.base, outcome, self.stage, message, self.per_shape,
                                    compiled=self.kp.compiled if self.kp else [], stderr_tail=stderr,
                                    stage_s=self.clock.so_far())


def judge(request: dict, channel: Channel, tmp: Path, started: float | None = None) -> list[Result]:
    """The whole evaluation of one kernel, or of several of one task timed together in ONE
    interleaved run per shape (request["kernels"]: [{label, source, base, launcher?}], a
    kernel's "launcher" overriding the request's); never raises:
    every failure is a Result. started: when its first stage ("load") began (default: when
    this judge's process began, _STARTED)."""
    from epiforge.eval.gpu_stages import run_timed_stages
    from epiforge.eval.numerics import check_shape
    from epiforge.eval.plausibility import Ceilings
    from epiforge.eval.remote import KernelFailure
    from epiforge.eval.numerics import mask_numbers
    from epiforge.eval.secret_shapes import hidden_shapes
    from epiforge.tasks import TaskCodeError, get_task, shape_sets

    device = request["device"]
    deadline = time.monotonic() + float(request["timeout_s"])
    clock = Stopwatch("load", _STARTED if started is None else started)
    # a kernel's own "launcher" (compare times a kernel in both modes side by side) or the job's
    cands = [Candidate(k["label"], k["source"], k["base"], clock, bool(k.get("launcher", request.get("launcher"))))
             for k in request["kernels"]]

    def at(name, who=None):
        clock.enter(name)
        for c in (who or [c for c in cands if c.live]):
            c.stage = name
        channel.stage(name)

    task = get_task(request["task"])
    precisions = request.get("dtypes") or [task.precision]
    for c in cands:
        c.base["dtypes"] = precisions  # what the Result is keyed on (eval.result.Result.dtype: the first)
    is_hidden = False
    try:
        at("load")
        ceilings = Ceilings.from_env()
        if device == "cuda":
            import torch

            torch.cuda.init()
        env = fingerprint(device, commit=False)
        if device == "cuda" and request.get("timing", True):
            from epiforge.eval.timing import LEAD

            env["timed_lead"] = LEAD.describe()  # the GPU's state before each timed call (eval/timing.py)
        for i, c in enumerate(cands):
            c.base["environment"] = dict(env)
            try:
                _start(c, tmp / f"runner-{i}", request, deadline, lambda name, c=c: at(name, [c]))
            except KernelFailure as f:
                c.finish(Outcome(f.outcome), f.message)
        named = shape_sets()[request["shapes"]]
        hidden = (hidden_shapes(request["shapes"], request["seed"], tokens_in_rows=task.tokens_in_rows)
                  if request.get("hidden_shapes", True) else [])
        # every shape (named, then hidden) in each precision, in this order; a job's place is
        # its seed index, so the first precision's seeds are those of a one-precision run
        jobs = [(p, shape, j >= len(named)) for p in precisions for j, shape in enumerate([*named, *hidden])]
        # numerics at every shape before anything is timed: a kernel that fails anywhere
        # never shows a speed, and no GPU time is spent timing it
        for i, (p, shape, is_hidden) in enumerate(jobs):
            at("numerics")
            for c in [c for c in cands if c.live]:
                res = check_shape(task.at(p), c.kp, shape, request["seed"], i, device, hidden=is_hidden)
                c.per_shape.append(res.model_copy(update={"dtype": p}))
                if res.outcome != Outcome.PASSED:
                    c.finish(res.outcome, f"{res.shape}{_in(p, precisions)}: {res.message}")
        is_hidden = False
        # on a GPU: the launch check in every precision, timing in the first only (one
        # precision per Result's speed numbers)
        for i, (p, shape, hid) in enumerate(jobs if device == "cuda" else []):
            group = {c.label: (c.kp, c.per_shape[i]) for c in cands if c.live}
            if hid or not group:
                continue
            timed = request.get("timing", True) and p == precisions[0]
            why = f"only {precisions[0]} is timed" if request.get("timing", True) else "asked for numerics and launches only"
            run_timed_stages(task.at(p), group, shape, request["seed"], i, stage=at, ceilings=ceilings,
                             reps=request.get("reps", 50), shapes_name=request["shapes"], device=device,
                             timed=timed, baselines=request.get("baselines", []), untimed_why=why)
            for c in [c for c in cands if c.live]:
                res = c.per_shape[i]
                if res.outcome != Outcome.PASSED:
                    c.finish(res.outcome, f"{res.shape}{_in(p, precisions)}: {res.message}")
        at("done")
        for c in [c for c in cands if c.live]:
            c.finish(Outcome.PASSED, _passed_message(c.per_shape, device, precisions, task.dtypes))
    except TaskCodeError as e:  # the task's reference.py failed: the task's fault, not a kernel's
        traceback.print_exc()
        detail = mask_numbers(e.detail) if is_hidden else e.detail  # it may quote the hidden shape's sizes
        for c in [c for c in cands if c.live]:
            c.finish(Outcome.TASK_ERROR, f"the task's code failed during {c.stage}, not the kernel: {e.file}: {detail}")
    except Exception as e:  # the judge's own failure (e.g. out of memory computing a reference)
        traceback.print_exc()
        first = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        why = "out of memory: a kernel's process may hold it" if "out of memory" in first.lower() else "an error"
        for c in [c for c in cands if c.live]:
            c.finish(Outcome.RUNTIME_ERROR, f"the judge stopped with {why} during {c.stage}: {first}")
    finally:
        for c in cands:
            if c.kp is not None:
                c.kp.close()
        _RUNNERS.clear()
    return [c.result for c in cands]


def _start(c: Candidate, workdir: Path, request: dict, deadline: float, on_progress) -> None:
    """The candidate's runner, its kernel loaded from the very text the harness checked (on
    a GPU: the strictest sandbox the CUDA driver starts in)."""
    from epiforge.eval.remote import DescribedKernel, KernelFailure, KernelProcess

    device = request["device"]
    workdir.mkdir(parents=True, exist_ok=True)
    kernel_copy = workdir / "kernel.py"
    kernel_copy.write_text(c.source)
    cpu_bytes = int(request["memory_limit_gib"] * 2**30) if (request.get("memory_limit_gib") and device == "cpu") else None
    from epiforge.tasks import get_task

    finishing = get_task(request["task"]).folder / "finishing.py"  # the task's own finishing steps, if any
    load = {"op": "load", "path": str(kernel_copy), "device": device, "gpu_memory_gib": request.get("gpu_memory_gib"),
            "finishing": str(finishing) if finishing.is_file() else None}
    describer = None
    if c.launcher:  # the kernel only describes itself, on a CPU runner; a launcher runs it
        describer = KernelProcess(workdir / "describer", deadline=deadline, cpu_bytes=cpu_bytes,
                                  extra_env=request.get("runner_env") or {}, on_progress=on_progress,
                                  believe_progress=False)
        _RUNNERS.append(describer)
        describer_load = {**load, "device": "cpu", "gpu_memory_gib": None}
        load = {**load, "path": None, "launcher": True}
        c.base["environment"]["judge_mode"] = "launcher: the kernel's process describes, a process without kernel code launches"
    else:
        c.base["environment"]["judge_mode"] = "one-process: the kernel's process runs it and reports its launches"
    sandboxes = ["system", "trees"] if device == "cuda" else [None]
    for i, mode in enumerate(sandboxes):
        c.kp = KernelProcess(workdir, deadline=deadline, cpu_bytes=cpu_bytes, extra_env=request.get("runner_env") or {},
                             on_progress=on_progress, cuda=mode)
        _RUNNERS.append(c.kp)
        c.base["environment"]["runner_sandbox"] = c.kp.sandbox
        if describer is not None and i == 0:  # both processes started: their imports overlap
            try:
                kernel_loaded = describer.ask(describer_load, stage="load")
            except BaseException:  # the kernel failed to load: both go now; its stderr is the describer's
                c.kp.close()
                c.kp = describer
                raise
        loaded = c.kp.ask(load, stage="load")
        if loaded.get("cuda") is not False:
            c.base["environment"]["runner_syscalls"] = loaded.get("syscalls")
            if describer is not None:  # runner_*: the process that holds the kernel's code
                c.base["environment"]["launcher_sandbox"] = c.kp.sandbox
                c.base["environment"]["runner_sandbox"] = describer.sandbox
                c.base["environment"]["runner_syscalls"] = kernel_loaded.get("syscalls")
                consts = [t.name for t in get_task(request["task"]).inputs if t.constant]
                c.kp = DescribedKernel(describer, c.kp, consts, device)
            return
        c.base["environment"]["runner_sandbox_blocked"] = f"{mode}: {loaded.get('why')}"[:300]
        c.kp.close()
        if i == len(sandboxes) - 1:
            if describer is not None:
                describer.close()
            raise KernelFailure("RUNTIME_ERROR", f"CUDA does not start in the runner: {loaded.get('why')}")


def _in(precision: str, precisions: list[str]) -> str:
    """ " in float16" where a run has several precisions (a failure names its own)."""
    return f" in {precision}" if len(precisions) > 1 or precision != "bfloat16" else ""


def _passed_message(per_shape: list[ShapeResult], device: str, precisions: list[str],
                    listed: list[str] | None = None) -> str:
    """The PASSED verdict's line; where the run was narrowed to fewer precisions than the
    task lists (`listed`), it ends by naming those not judged (a PASSED there says nothing
    about them)."""
    shown = [r for r in per_shape if not r.hidden]
    n, hid = len(shown) // len(precisions), (len(per_shape) - len(shown)) // len(precisions)
    where = f" in {' and '.join(precisions)}" if _in(precisions[0], precisions) else ""
    msg = (f"all {n} shapes within tolerance{where} ({shown[0].trials if shown else 0} trials each)"
           + (f", and {hid} hidden shape(s)" if hid else ""))
    if device == "cuda":
        ratios = ", ".join(f"{r.shape} {r.timing.fused_over_gemm_only.median:.3f}" for r in shown if r.timing)
        msg += f"; fused / GEMM-only{where and f' (in {precisions[0]})'}: {ratios}" if ratios else "; not timed"
    left_out = [p for p in (listed or []) if p not in precisions]
    if left_out:
        msg += f"; not judged in {' or '.join(left_out)} (narrowed by --dtype)"
    return msg


def _between_jobs(device: str | None) -> None:
    """What one job leaves that the next must not meet: dynamo's in-memory cache (one
    code object, baselines.unfused_fn's, serves every task: its entries would pile up to
    dynamo's recompile limit, past which it runs the baseline uncompiled) and the GPU
    memory the last job's tensors held."""
    import gc

    gc.collect()
    if "torch" in sys.modules:
        import torch

        torch._dynamo.reset()
        if device == "cuda" and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def _on_term(signum, frame):
    """The harness died (parent-death signal) or asked us to stop: leave nothing behind."""
    for kp in _RUNNERS:
        kp.kill()
    if _TMP is not None:
        shutil.rmtree(_TMP, ignore_errors=True)
    os._exit(128 + signum)


def main(argv=None) -> int:
    global _TMP
    make_undumpable()
    ap = argparse.ArgumentParser()
    ap.add_argument("--result-fd", type=int, required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--parent", type=int, required=True)
    args = ap.parse_args(argv)
    setup_child(args.parent, death_signal=signal.SIGTERM)
    _TMP = Path(args.tmp)
    signal.signal(signal.SIGTERM, _on_term)
    os.set_inheritable(args.result_fd, False)
    request = json.loads(sys.stdin.read())
    sys.stdin.close()
    channel = Channel(args.result_fd, request.pop("nonce", ""))
    if "jobs" not in request:
        results = judge(request, channel, _TMP)
        channel.send(result={"results": [r.model_dump(mode="json") for r in results]})
    for i, job in enumerate(request.get("jobs", [])):
        # several tasks, one after another in this one process: what every process pays
        # once (CUDA, cuBLAS, Inductor's and Liger's first compile, quack's loaded GEMMs)
        # is paid once; each job starts from torch.compile's empty cache, as a fresh judge
        # would, with its own seed, deadline, runners and temp dir
        began = _STARTED if i == 0 else time.monotonic()
        if i:
            _between_jobs(job.get("device"))
        channel.job = i
        workdir = _TMP / f"job-{i}"
        results = judge(job, channel, workdir, started=began)
        channel.send(result={"results": [r.model_dump(mode="json") for r in results]})
        shutil.rmtree(workdir, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
