"""`compare --ray`: a compare run spread over a Ray cluster, one Ray task per task of the run.

    compare_on_ray(plans, address=None, device="gpu", shapes="paper", ...) -> [Comparison]

Each Ray task runs compare_all() for one task on a worker of the cluster, so everything a
single machine's compare does still happens inside it: the static stage, then one judge
process per task with its runner processes in their sandbox (a worker only starts the
judge; generated code never runs in a Ray worker itself). On a GPU each task asks the
cluster for one GPU, so a node times one task per GPU at a time; on a CPU for one CPU.
`resources` replaces that request (e.g. {"resources": {"emulated_gpu": 1}}: emulator
workers standing in for GPUs).

The head (the process that calls this) collects each task's Results as they finish and
hands them to on_done at once, in the order they finish; a store written there is written
by the head alone, each Result under the key "<run>/<task>/<label>" (eval/store.py: a key
already stored is not stored again). Faults: a worker that dies mid-task (its process
killed, its node lost) is retried on another by Ray (max_retries); a retried task starts
its judge afresh under the same run and keys, so a Result is stored exactly once, and the
Results that had already reached the head are kept whatever happens to the cluster after.
A task whose worker died on every try, or whose compare raised, comes back as a RUNTIME_ERROR
Result for each of its kernels, saying so.

A cluster's nodes need epiforge installed, at the same version and with the same kernel
files as the head (the kernels are sent as paths, read by the worker). Ray is optional:
`pip install 'epiforge[ray]'`.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from pathlib import Path

from epiforge.eval.compare import Comparison, compare_all
from epiforge.eval.result import Outcome, Result

#: how often Ray retries a task whose worker died (Ray's own default is 3)
MAX_RETRIES = 3
#: the environment variable naming a folder where each task's worker writes "<task>.<pid>"
#: when it starts: how a watcher (the fault test) finds the worker to kill
PROGRESS_DIR_ENV = "EPIFORGE_RAY_PROGRESS_DIR"

INSTALL_HINT = "--ray needs Ray: pip install 'epiforge[ray]'"


def import_ray():
    """Ray, or a one-line ValueError that says what to install (the CLI prints it)."""
    try:
        import ray
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return ray


def failure_line(e: BaseException) -> str:
    """One line for a Ray task that failed: its own exception where Ray wraps one (RayTaskError's
    cause), else Ray's (a worker lost)."""
    cause = getattr(e, "cause", None) or e
    return f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0][:200]}"


def on_ray(fn, calls: list[tuple], *, address: str | None, resources: dict, on_result) -> None:
    """fn(*call) for every call, each a Ray task asking for `resources`, retried MAX_RETRIES
    times where its worker dies (never where fn raised), on the cluster at `address` (None: a
    local one started here, shut down after; a Ray already initialized in this process is
    used as it is). on_result(i, value, error) hears each as it ends, in the order they end:
    error is None, or one line (failure_line) and value None."""
    ray = import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        remote = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False, **resources)(fn)
        pending = {remote.remote(*call): i for i, call in enumerate(calls)}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(ready[0])
            try:
                value, error = ray.get(ready[0]), None
            except Exception as e:  # noqa: BLE001 - the task failed for good: the caller's verdict says so
                value, error = None, failure_line(e)
            on_result(i, value, error)
    finally:
        if started_here:
            ray.shutdown()


def mark_started(name: str) -> None:
    """On a worker: "<name>.<pid>" in $EPIFORGE_RAY_PROGRESS_DIR where that is set (a watcher's
    way to find the worker; the workers of a cluster started here inherit the variable)."""
    if os.environ.get(PROGRESS_DIR_ENV):
        Path(os.environ[PROGRESS_DIR_ENV], f"{name}.{os.getpid()}").touch()


def evaluation_key(run: str, task: str, label: str) -> str:
    return f"{run}/{task}/{label}"


def _one_task(plan: tuple[str, list[tuple[str, str]]], kw: dict) -> dict:
    """On a worker: compare_all() of one task; returns its Comparison as plain data."""
    task, kernels = plan
    mark_started(task)
    (cmp,) = compare_all([(task, [(label, Path(path)) for label, path in kernels])], **kw)
    return cmp.model_dump(mode="json")


def _lost(task: str, kernels: list[tuple[str, str]], device: str, shapes: str, why: str) -> Comparison:
    """Every kernel of a task whose Ray task failed for good: a RUNTIME_ERROR Result each."""
    def sha(path: str) -> str:
        try:
            return hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            return ""

    results = [Result.stopped({"task": task, "kernel": path, "kernel_sha256": sha(path), "track": "candidate",
                               "device": device, "shapes": shapes}, Outcome.RUNTIME_ERROR, "load",
                              f"the cluster could not run this task (a worker lost {MAX_RETRIES + 1} times, or its "
                              f"compare failed): {why}")
               for _, path in kernels]
    return Comparison(task=task, device=device, shapes=shapes, labels=[label for label, _ in kernels], results=results)


def compare_on_ray(plans: list[tuple[str, list[tuple[str, Path]]]], *, address: str | None = None,
                   device: str = "cpu", shapes: str = "smoke", seed: int | None = None, reps: int = 30,
                   baselines: list[str] = (), dtype=None, compile: bool = False, launcher: bool = True,
                   resources: dict | None = None, on_done=None, run: str | None = None,
                   store=None) -> list[Comparison]:
    """compare_all()'s plans, one Ray task each (module docstring). address: a running
    cluster's ("auto": the one this machine belongs to), None: a local one started here for
    this call. run: the run's id in the evaluation keys (default: a fresh one). store: a
    ResultStore the head adds each Result to, under its key. Returns the Comparisons in
    the plans' order."""
    run = run or f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"
    dev = "cuda" if device in ("gpu", "cuda") else "cpu"
    kw = dict(device=device, shapes=shapes, seed=seed, reps=reps, baselines=list(baselines), dtype=dtype,
              compile=compile, launcher=launcher)
    sent = [(task, [(label, str(Path(path).resolve())) for label, path in kernels]) for task, kernels in plans]
    done: dict[int, Comparison] = {}

    def heard(i: int, value: dict | None, error: str | None) -> None:
        task, kernels = sent[i]
        cmp = Comparison.model_validate(value) if error is None else _lost(task, kernels, dev, shapes, error)
        if store is not None:
            for label, result in zip(cmp.labels, cmp.results):
                store.add(result, key=evaluation_key(run, cmp.task, label))
        done[i] = cmp
        if on_done is not None:
            on_done(cmp)

    on_ray(_one_task, [(plan, kw) for plan in sent], address=address,
           resources=resources or ({"num_gpus": 1} if dev == "cuda" else {"num_cpus": 1}), on_result=heard)
    return [done[i] for i in range(len(sent))]
