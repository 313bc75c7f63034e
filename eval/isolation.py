"""Isolation: one worker process per candidate, and what is left of it when it misbehaves.

The worker (eval/worker.py) starts in a new session (its own process group), in a private
temp dir as its working directory, with an allowlisted environment (no API keys or other
secrets), CPU memory and file-size limits, no core dumps, and a wall-clock timeout that
kills the whole group (anything the kernel left running too). It answers on a private
pipe, never stdout: newline-delimited JSON frames carrying a nonce the harness sent on
stdin. Whatever happens to the worker (an infinite loop, a segfault, an illegal memory
access, device OOM, a compiler crash), the harness gets a typed outcome and the next
candidate runs in a fresh process with a fresh CUDA context.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STDERR_TAIL = 4000
MAX_CHANNEL_BYTES = 32 * 2**20
FILE_SIZE_LIMIT = 2 * 2**30  # stderr spam or a runaway write stops here (SIGXFSZ)

#: the worker's environment is these names and prefixes of ours, minus anything secret-looking
ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TMPDIR", "TZ", "PYTHONPATH", "PYTHONHASHSEED",
    "LD_LIBRARY_PATH", "VIRTUAL_ENV", "XDG_CACHE_HOME", "CC", "CXX", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG",
})
ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NV_", "CUTE_DSL_", "CUTLASS_", "QUACK_", "TRITON_", "TORCH_", "PYTORCH_",
                "EPIFORGE_")
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "PRIVATE", "SESSION")


def clean_env(extra: dict | None = None, base: dict | None = None) -> dict:
    """The worker's environment: allowlisted names of `base` (ours by default) minus
    anything that looks like a secret, plus `extra`."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items()
           if (k in ENV_NAMES or k.startswith(ENV_PREFIXES)) and not any(m in k.upper() for m in SECRET_MARKERS)}
    # the repo first; keep the rest (on the GPU machine quack and pydantic live there)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra or {})
    return env


def _limits(cpu_bytes: int | None):
    def apply():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
        if cpu_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (cpu_bytes, cpu_bytes))

    return apply


@dataclass
class WorkerRun:
    """What came back from one worker."""

    result: dict | None = None
    stage: str = "load"
    stages: list[str] = field(default_factory=list)
    tampered: str | None = None  # why the channel's content is not to be trusted
    timed_out: bool = False
    returncode: int | None = None
    stderr_tail: str = ""
    wall_s: float = 0.0

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None


def parse_frames(data: bytes, nonce: str) -> tuple[list[str], dict | None, str | None]:
    """(stages, result, why-tampered) from the channel's bytes. Every complete line must be
    a JSON object with our nonce; the one result frame must be the last; a partial last
    line (a worker killed mid-write) is ignored."""
    stages, result = [], None
    lines = data.split(b"\n")
    for raw in lines[:-1]:
        try:
            frame = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return stages, None, "a line on the result channel is not a frame of the worker's"
        if not isinstance(frame, dict) or frame.get("nonce") != nonce:
            return stages, None, "a frame on the result channel does not carry the worker's nonce"
        if result is not None:
            return stages, None, "frames after the result"
        if "stage" in frame:
            stages.append(str(frame["stage"]))
        elif isinstance(frame.get("result"), dict):
            result = frame["result"]
        else:
            return stages, None, "an unknown frame on the result channel"
    if lines[-1] and result is not None:
        return stages, None, "bytes after the result"
    return stages, result, None


def run_worker(request: dict, *, timeout_s: float, cpu_bytes: int | None = None, extra_env: dict | None = None,
               module: str = "eval.worker") -> WorkerRun:
    """Start the worker, feed it the request, read its frames until it closes the pipe or
    the time is up, then kill its whole process group."""
    nonce = secrets.token_hex(16)
    started = time.monotonic()
    read_fd, write_fd = os.pipe()
    out = WorkerRun()
    with tempfile.TemporaryDirectory(prefix="epiforge-eval-") as tmp:
        err_path = Path(tmp) / ".stderr.log"
        work = Path(tmp) / "work"
        work.mkdir()
        with open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", module, "--result-fd", str(write_fd)],
                    stdin=subprocess.PIPE, stdout=err, stderr=err, cwd=work, env=clean_env(extra_env),
                    pass_fds=(write_fd,), start_new_session=True, preexec_fn=_limits(cpu_bytes),
                )
            finally:
                os.close(write_fd)
            try:
                proc.stdin.write(json.dumps({**request, "nonce": nonce}).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            data, too_much = _read_until_eof(read_fd, proc, started + timeout_s)
            out.timed_out = time.monotonic() >= started + timeout_s and not _complete(data, nonce)
            try:
                proc.wait(timeout=0.1 if out.timed_out else 10)
            except subprocess.TimeoutExpired:
                pass
            kill_group(proc)  # also ends anything the kernel left running
            out.returncode = proc.wait()
        os.close(read_fd)
        out.stderr_tail = err_path.read_bytes()[-STDERR_TAIL:].decode(errors="replace")
    out.stages, out.result, out.tampered = parse_frames(data, nonce)
    if too_much:
        out.result, out.tampered = None, f"more than {MAX_CHANNEL_BYTES} bytes on the result channel"
    out.stage = out.stages[-1] if out.stages else "load"
    out.wall_s = round(time.monotonic() - started, 3)
    return out


def _complete(data: bytes, nonce: str) -> bool:
    return parse_frames(data, nonce)[1] is not None


def _read_until_eof(fd: int, proc: subprocess.Popen, deadline: float) -> tuple[bytes, bool]:
    chunks, size = [], 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b"".join(chunks), False
        ready, _, _ = select.select([fd], [], [], min(remaining, 0.5))
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:  # EOF: the worker (and everything holding the pipe) is gone
            return b"".join(chunks), False
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_CHANNEL_BYTES:
            return b"".join(chunks), True


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
