"""`evaluate()`: check one kernel against one task; the candidate runs isolated in a worker.

Stages: static checks (here, on the source; eval/static_checks.py) -> in the worker
(eval/worker.py): load -> compile -> numerics -> on a GPU launches -> benchmark ->
recheck -> plausibility. The harness never imports a candidate; eval/isolation.py runs
the worker and turns whatever happened to it into one typed outcome.
"""

from __future__ import annotations

import ast
import hashlib
import platform
import secrets
from pathlib import Path

from eval.isolation import clean_env, run_worker  # noqa: F401  (clean_env: re-exported)
from eval.kernel import KernelError, read_kernel, resolve_kernel
from eval.result import Outcome, Result, ShapeResult
from eval.static_checks import check_source, only_compile_errors, summarize
from tasks import TaskError, get_task, shape_sets

DEFAULT_TIMEOUT_S = {"cpu": 600, "cuda": 900}


def environment_fingerprint(device: str) -> dict:
    """Versions of this process's machine (the agent's logs use it; on "cuda" it touches
    the GPU in the calling process, which evaluate() itself never does)."""
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine()}
    if device == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


def evaluate(
    task_name: str,
    kernel: str | Path,
    *,
    device: str = "cpu",
    shapes: str = "smoke",
    seed: int | None = None,
    timeout_s: float | None = None,
    memory_limit_gib: float | None = 16,
    compile: bool = False,
    static_checks: bool = True,
    gpu_memory_gib: float | None = None,
    reps: int = 50,
) -> Result:
    """Evaluate `kernel` ("human", "generated:ID" or a path) on `task_name`.

    device: "cpu" (the emulator) or "gpu"/"cuda". On a CPU, `compile=True` also builds
    every epilogue the kernel launches for sm_90a (the GPU kernel, cross-compiled).
    seed: the master seed of the inputs (default: a fresh secret one). memory_limit_gib:
    the worker's CPU address-space limit (CPU runs); gpu_memory_gib: its share of the GPU.
    static_checks=False is for the evaluator's own tests of the layers behind the rules
    (tests/exploits); never turn it off for a real candidate. Raises ValueError / TaskError /
    KernelError (one line) for bad arguments; everything about the kernel is the Result."""
    device = "cuda" if device in ("gpu", "cuda") else device
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or gpu, got {device!r}")
    task = get_task(task_name)
    if shapes not in shape_sets():
        raise ValueError(f"unknown shape set {shapes!r}; known: {sorted(shape_sets())}")
    path = resolve_kernel(str(kernel), task.name)
    try:
        source = path.read_bytes()
    except OSError as e:
        raise KernelError(f"{path}: cannot read: {e.strerror}") from None
    base = dict(task=task.name, kernel=str(kernel), kernel_sha256=hashlib.sha256(source).hexdigest(), device=device,
                shapes=shapes, environment={"python": platform.python_version(), "machine": platform.machine()})

    early = _before_running(task, path, source, base, static_checks)
    if isinstance(early, Result):
        return early
    base = early
    timeout = timeout_s or DEFAULT_TIMEOUT_S[device]
    request = {"task": task.name, "kernel_path": str(path.resolve()), "device": device, "shapes": shapes,
               "seed": secrets.randbelow(2**31) if seed is None else int(seed), "reps": int(reps),
               "gpu_memory_gib": gpu_memory_gib}
    extra_env = {}
    if compile and device == "cpu":
        extra_env = {"EPIFORGE_CROSS_COMPILE": "1", "CUTE_DSL_ARCH": "sm_90a", "QUACK_ARCH": "90"}
    cpu_bytes = int(memory_limit_gib * 2**30) if (memory_limit_gib and device == "cpu") else None
    run = run_worker(request, timeout_s=timeout, cpu_bytes=cpu_bytes, extra_env=extra_env)
    return _from_worker(run, base, timeout)


def _before_running(task, path: Path, source: bytes, base: dict, static_checks: bool):
    """Metadata and the static stage: a Result when the kernel stops here, else the
    Result fields learnt from its metadata."""
    text = source.decode(errors="replace")
    try:
        ast.parse(text, filename=str(path))
    except SyntaxError as e:
        return Result(**base, track="candidate", outcome=Outcome.COMPILE_ERROR, stage="static",
                      message=f"line {e.lineno}: syntax error: {e.msg}")
    try:
        meta = read_kernel(path)
    except KernelError as e:
        return Result(**base, track="candidate", outcome=Outcome.STATIC_REJECTED, stage="static",
                      message=str(e).splitlines()[0])
    base = {**base, "track": meta.track, "author": meta.author, "backend": meta.backend, "model": meta.model,
            "session": meta.session}
    if meta.task != task.name:
        return Result(**base, outcome=Outcome.STATIC_REJECTED, stage="static",
                      message=f"the kernel's TASK is {meta.task!r}, not {task.name!r}")
    if static_checks:
        violations = check_source(text, str(path))
        if violations:
            outcome = Outcome.COMPILE_ERROR if only_compile_errors(violations) else Outcome.STATIC_REJECTED
            return Result(**base, outcome=outcome, stage="static", message=summarize(violations),
                          violations=[str(v) for v in violations])
    return base


def _from_worker(run, base: dict, timeout: float) -> Result:
    base = {**base, "stderr_tail": run.stderr_tail, "wall_s": run.wall_s}
    if run.tampered:
        return Result(**base, outcome=Outcome.RUNTIME_ERROR, stage=run.stage,
                      message=f"the result channel was tampered with ({run.tampered}); result discarded")
    if run.timed_out:
        return Result(**base, outcome=Outcome.TIMEOUT, stage=run.stage,
                      message=f"no result within {timeout:g} s (during {run.stage}); process group killed")
    raw = run.result
    if raw is None:
        why = run.signal_name or f"exit code {run.returncode}"
        if run.stage == "compile":
            return Result(**base, outcome=Outcome.COMPILE_ERROR, stage=run.stage,
                          message=f"the compiler crashed ({why}) while building the kernel")
        return Result(**base, outcome=Outcome.RUNTIME_ERROR, stage=run.stage,
                      message=f"the worker died ({why}) during {run.stage}, before reporting")
    env = {**base.pop("environment"), **raw.get("environment", {})}
    return Result(**base, environment=env, outcome=Outcome(raw["outcome"]), message=raw["message"],
                  stage=raw.get("stage"), per_shape=[ShapeResult(**r) for r in raw["per_shape"]],
                  compiled=raw.get("compiled", []), violations=raw.get("violations", []), worst=raw.get("worst"))


__all__ = ["evaluate", "environment_fingerprint", "KernelError", "TaskError"]
