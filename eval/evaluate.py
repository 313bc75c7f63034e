"""`evaluate()`: check one kernel against one task, the candidate isolated in a subprocess.

The harness never imports a candidate. The worker (eval/worker.py) runs in a new process
group, in a private temp dir, with an environment stripped of secrets, under a wall-clock
timeout that kills the whole group; it answers on a private pipe, not on stdout.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eval.kernel import REPO, KernelError, read_kernel, resolve_kernel
from eval.result import Outcome, Result, ShapeResult
from tasks import TaskError, get_task

DEFAULT_TIMEOUT_S = {"cpu": 600, "cuda": 900}
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "AUTH")
_STDERR_TAIL = 4000


def clean_env(extra: dict | None = None) -> dict:
    """The worker's environment: ours minus anything that looks like a secret."""
    env = {k: v for k, v in os.environ.items() if not any(m in k.upper() for m in _SECRET_MARKERS)}
    env.pop("PYTHONSTARTUP", None)
    # the repo first; keep the rest (on the GPU machine quack and pydantic live there)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _limit_memory(cpu_bytes: int | None):
    def apply():
        if cpu_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (cpu_bytes, cpu_bytes))

    return apply


def environment_fingerprint(device: str) -> dict:
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
) -> Result:
    """Evaluate `kernel` ("human", "generated:ID" or a path) on `task_name`. On a CPU,
    `compile=True` also builds every epilogue the kernel launches for sm_90a (the GPU
    kernel itself, cross-compiled) before emulating it."""
    started = time.monotonic()
    device = "cuda" if device in ("gpu", "cuda") else device
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or gpu, got {device!r}")
    task = get_task(task_name)
    path = resolve_kernel(str(kernel), task.name)
    meta = read_kernel(path)
    base = dict(task=task.name, kernel=str(kernel), kernel_sha256=meta.sha256, track=meta.track, author=meta.author,
                backend=meta.backend, model=meta.model, session=meta.session, device=device, shapes=shapes,
                environment=environment_fingerprint(device))
    if meta.task != task.name:
        return Result(**base, outcome=Outcome.STATIC_REJECTED,
                      message=f"the kernel's TASK is {meta.task!r}, not {task.name!r}")
    request = {"task": task.name, "kernel_path": str(path.resolve()), "device": device, "shapes": shapes,
               "seed": secrets.randbelow(2**31) if seed is None else seed}
    extra_env = {}
    if compile and device == "cpu":
        extra_env = {"EPIFORGE_CROSS_COMPILE": "1", "CUTE_DSL_ARCH": "sm_90a", "QUACK_ARCH": "90"}
    raw, stderr_tail, timed_out, rc = _run_worker(
        request, extra_env, timeout_s or DEFAULT_TIMEOUT_S[device],
        int(memory_limit_gib * 2**30) if (memory_limit_gib and device == "cpu") else None,
    )
    wall = round(time.monotonic() - started, 3)
    if timed_out:
        return Result(**base, outcome=Outcome.TIMEOUT, message=f"no result within {timeout_s or DEFAULT_TIMEOUT_S[device]} s; process group killed",
                      stderr_tail=stderr_tail, wall_s=wall)
    if raw is None:
        why = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        return Result(**base, outcome=Outcome.RUNTIME_ERROR, message=f"the worker died ({why}) before reporting",
                      stderr_tail=stderr_tail, wall_s=wall)
    return Result(**base, outcome=Outcome(raw["outcome"]), message=raw["message"],
                  per_shape=[ShapeResult(**r) for r in raw["per_shape"]], compiled=raw.get("compiled", []),
                  stderr_tail=stderr_tail, wall_s=wall)


def _run_worker(request: dict, extra_env: dict, timeout_s: float, cpu_bytes: int | None):
    """Start the worker, feed it the request, wait; kill its whole group on timeout.
    Returns (result dict or None, stderr tail, timed_out, return code)."""
    read_fd, write_fd = os.pipe()
    with tempfile.TemporaryDirectory(prefix="epiforge-eval-") as tmp:
        err_path = Path(tmp) / "stderr.log"
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "eval.worker", "--result-fd", str(write_fd)],
                stdin=subprocess.PIPE, stdout=err, stderr=err, cwd=tmp, env=clean_env(extra_env),
                pass_fds=(write_fd,), start_new_session=True, preexec_fn=_limit_memory(cpu_bytes),
            )
            os.close(write_fd)
            try:
                proc.stdin.write(json.dumps(request).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            chunks, timed_out = [], False
            deadline = time.monotonic() + timeout_s
            while True:  # until EOF: the worker closed its end (finished or died)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                ready, _, _ = select.select([read_fd], [], [], min(remaining, 1.0))
                if ready:
                    data = os.read(read_fd, 1 << 16)
                    if not data:
                        break
                    chunks.append(data)
            try:
                rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()) if not timed_out else 0.1)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(proc)  # also ends anything the kernel left running
            rc = proc.wait()
        os.close(read_fd)
        stderr_tail = err_path.read_bytes()[-_STDERR_TAIL:].decode(errors="replace")
    raw = None
    if chunks and not timed_out:
        try:
            raw = json.loads(b"".join(chunks))
        except json.JSONDecodeError:
            raw = None
    return raw, stderr_tail, timed_out, rc


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


__all__ = ["evaluate", "KernelError", "TaskError"]
