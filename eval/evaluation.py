"""`evaluate()`: check one kernel against one task. The harness never runs a candidate,
and never holds what judges it for longer than it takes to hand it over.

    harness (here)  ->  judge process (eval/judge.py: static rules, references, verdict)
                    ->  runner process (eval/runner.py: the candidate's code, nothing else)

Stages: static (here: the source read once, parsed with bounds, checked; nothing of it
runs) -> in the judge: load -> compile -> numerics -> on a GPU launches -> benchmark ->
recheck -> plausibility -> done. This module validates the arguments, draws the secret
seed, starts the judge (eval/isolation.py) with the checked text, and turns whatever
happened to it into one typed Result.
"""

from __future__ import annotations

import hashlib
import platform
import secrets
from pathlib import Path

from epiforge.eval.isolation import clean_env, run_judge  # noqa: F401  (clean_env: re-exported)
from epiforge.eval.kernel import KernelError, resolve_kernel
from epiforge.eval.result import Outcome, Result
from epiforge.primitives.config import ALSO_COMPILE_ENV, tuned_in_source
from epiforge.tasks import TaskError, get_task, shape_sets

DEFAULT_TIMEOUT_S = {"cpu": 600, "cuda": 900}


def check_arguments(task_name: str, device: str, shapes: str):
    """(device as "cpu" | "cuda", the Task) for a request, or one line (ValueError, TaskError)."""
    device = "cuda" if device in ("gpu", "cuda") else device
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or gpu, got {device!r}")
    task = get_task(task_name)
    if shapes not in shape_sets():
        raise ValueError(f"unknown shape set {shapes!r}; known: {sorted(shape_sets())}")
    return device, task


#: the most TUNED configs one --tuned evaluation builds (a table is a handful; a hostile one is cut)
MAX_TUNED_BUILDS = 32
#: what --dtype accepts besides the names themselves
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def pick_dtypes(task, dtype=None) -> list[str]:
    """The precisions to judge `task` in, in order: None or "all" every one it lists (its
    `dtypes`, the first timed on a GPU), else the named ones ("float16", "bf16,fp16" or a
    list), which narrows the verdict (its message names the precisions left out); ValueError
    (one line) otherwise. A kernel right in one precision and wrong in another is wrong."""
    if dtype is None or dtype == "all":
        return list(task.dtypes)
    names = dtype.split(",") if isinstance(dtype, str) else list(dtype)
    picked = []
    for name in (n.strip() for n in names):
        full = DTYPE_ALIASES.get(name, name)
        if full not in task.dtypes:
            raise ValueError(f"--dtype {name!r}: {task.name} runs in {', '.join(task.dtypes)} (or all)")
        if full not in picked:
            picked.append(full)
    if not picked:
        raise ValueError(f"--dtype: no precision named; {task.name} runs in {', '.join(task.dtypes)} (or all)")
    return picked


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
    hidden_shapes: bool = True,
    timing: bool = True,
    dtype=None,
    on_stage=None,
    launcher: bool = True,
    tuned: bool = False,
) -> Result:
    """Evaluate `kernel` ("human", "generated:ID" or a path) on `task_name`.

    device: "cpu" (the emulator) or "gpu"/"cuda". On a CPU, `compile=True` also builds
    every epilogue the kernel launches for sm_90a (the GPU kernel, cross-compiled), and
    `tuned=True` builds each with every config of the kernel's TUNED table too (read from its
    text: the configs the paper shapes pick, which the smoke shapes never do).
    seed: the master seed of the inputs and hidden shapes (default: a fresh secret one).
    timeout_s: the whole evaluation's limit (default 600 s on a CPU, 900 s on a GPU).
    memory_limit_gib: the runner's CPU address-space limit (CPU runs); gpu_memory_gib: its
    share of the GPU. timing=False (GPU): numerics and launches only, nothing timed.
    dtype: the precisions to judge in (pick_dtypes; default every one the task lists, a
    name or a comma list narrows it); on a GPU only the first is timed, the others get
    numerics and the launch check.
    static_checks=False and hidden_shapes=False are for the evaluator's
    own tests of the layers behind them (tests/exploits); never turn them off for a real
    candidate. launcher (the default): the kernel's process only describes its calls, on
    fake tensors of each input set's shapes on `device` (primitives/program.py), and a
    second process that runs no kernel code launches the description and reports what it
    launched (eval/remote.py DescribedKernel); launcher=False runs the kernel in its own
    process, whose launch record it could forge (the known limits of
    tests/exploits/CLASSES.md). on_stage(name) hears each stage as it starts. Raises ValueError / TaskError
    / KernelError (one line) for bad arguments; everything about the kernel is the Result."""
    device, task = check_arguments(task_name, device, shapes)
    dtypes = pick_dtypes(task, dtype)
    if tuned and not (compile and device == "cpu"):
        raise ValueError("tuned: the TUNED configs are built by the CPU's cross-compile (compile=True on the CPU)")
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"the timeout must be a positive number of seconds, got {timeout_s}")
    path = resolve_kernel(str(kernel), task.name)
    try:
        source = path.read_bytes()
    except OSError as e:
        raise KernelError(f"{path}: cannot read: {e.strerror}") from None
    base = dict(task=task.name, kernel=str(kernel), kernel_sha256=hashlib.sha256(source).hexdigest(), device=device,
                shapes=shapes, dtypes=dtypes,
                environment={"python": platform.python_version(), "machine": platform.machine()})
    text = source.decode(errors="replace")
    early = static_stage(task, path, text, base, static_checks)
    if isinstance(early, Result):
        return early
    base = {**early, "track": early.get("track", "candidate")}
    timeout = float(timeout_s or DEFAULT_TIMEOUT_S[device])
    runner_env = {}
    if compile and device == "cpu":
        runner_env = {"EPIFORGE_CROSS_COMPILE": "1", "CUTE_DSL_ARCH": "sm_90a", "QUACK_ARCH": "90"}
        configs = sorted(set(tuned_in_source(text).values()))[:MAX_TUNED_BUILDS] if tuned else []
        if configs:
            runner_env[ALSO_COMPILE_ENV] = ",".join(configs)
    request = {"task": task.name, "device": device, "shapes": shapes,
               "kernels": [{"label": "kernel", "source": text, "base": {k: v for k, v in base.items() if k != "environment"}}],
               "seed": secrets.randbelow(2**31) if seed is None else int(seed), "reps": int(reps),
               "gpu_memory_gib": gpu_memory_gib, "memory_limit_gib": memory_limit_gib,
               "static_checks": bool(static_checks), "hidden_shapes": bool(hidden_shapes), "timing": bool(timing),
               "runner_env": runner_env, "dtypes": dtypes, "launcher": bool(launcher)}
    run = run_judge(request, timeout_s=timeout, on_stage=on_stage)
    return _from_judge(run, base, timeout)


def static_stage(task, path: Path, text: str, base: dict, static_checks: bool) -> Result | dict:
    """The source's metadata and the static rules, on the text as read once: a Result when
    the kernel stops here, else the Result fields learnt from its metadata. Only parsing
    (bounded in size and depth): nothing of the source runs here."""
    from epiforge.eval.kernel import read_kernel
    from epiforge.eval.static_checks import (SourceTooComplex, check_source, only_compile_errors, parse_bounded,
                                             summarize, syntax_error_line)

    try:
        parse_bounded(text, str(path))
    except SyntaxError as e:
        return Result.stopped(base, Outcome.COMPILE_ERROR, "static", syntax_error_line(e), track="candidate")
    except SourceTooComplex as e:
        return Result.stopped(base, Outcome.STATIC_REJECTED, "static", f"static checks: {e} [size]",
                              track="candidate", violations=[f"line {e.line}: {e} [size]"])
    except Exception as e:  # noqa: BLE001 - a source the reader cannot take is never run
        return _undecided(base, "parser", e, track="candidate")
    try:
        meta = read_kernel(path, source=text)
    except KernelError as e:
        return Result.stopped(base, Outcome.STATIC_REJECTED, "static", str(e).splitlines()[0], track="candidate")
    except Exception as e:  # noqa: BLE001
        return _undecided(base, "metadata reader", e, track="candidate")
    base = {**base, "track": meta.track, "author": meta.author, "backend": meta.backend, "model": meta.model,
            "session": meta.session}
    if meta.task != task.name:
        return Result.stopped(base, Outcome.STATIC_REJECTED, "static",
                              f"the kernel's TASK is {meta.task!r}, not {task.name!r}")
    if static_checks:
        try:
            violations = check_source(text, str(path))
        except SyntaxError as e:
            return Result.stopped(base, Outcome.COMPILE_ERROR, "static", syntax_error_line(e))
        except (RecursionError, MemoryError, ValueError) as e:
            return Result.stopped(base, Outcome.STATIC_REJECTED, "static",
                                  f"the source is too large or too deeply nested to check ({type(e).__name__})")
        except Exception as e:  # noqa: BLE001
            return _undecided(base, "static checker", e)
        if violations:
            outcome = Outcome.COMPILE_ERROR if only_compile_errors(violations) else Outcome.STATIC_REJECTED
            return Result.stopped(base, outcome, "static", summarize(violations),
                                  violations=[str(v) for v in violations])
    return base


def _undecided(base: dict, who: str, e: Exception, **extra) -> Result:
    """The static stage could not decide on a source (a fault of the harness's own reader or
    checker, not named by any rule): rejected, never run, in one line that says so, instead
    of a traceback that would take the CLI or the agent's session down with it."""
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return Result.stopped(base, Outcome.STATIC_REJECTED, "static",
                          f"the {who} failed on this source ({type(e).__name__}: {first}); it is not run. "
                          "This is an evaluator fault: please report it with the kernel file", **extra)


def _from_judge(run, base: dict, timeout: float) -> Result:
    if run.result is not None and run.broken is None:
        (result,) = [Result.model_validate(r) for r in run.result["results"]]
        return result.model_copy(update={"wall_s": run.wall_s} if result.wall_s is None and result.stage != "static"
                                 else {})
    base = {**base, "stderr_tail": run.stderr_tail, "wall_s": run.wall_s}
    if run.timed_out:
        return Result.stopped(base, Outcome.TIMEOUT, run.stage,
                              f"no result within {timeout:g} s (during {run.stage}); the evaluation was killed")
    why = run.broken or run.signal_name or f"exit code {run.returncode}"
    return Result.stopped(base, Outcome.RUNTIME_ERROR, run.stage,
                          f"the judge ended without a verdict ({why}) during {run.stage}")


__all__ = ["evaluate", "pick_dtypes", "KernelError", "TaskError"]
