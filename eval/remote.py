"""The judge's handle on a kernel runner (eval/runner.py): start it, ask, check the answer.

Every answer is read as untrusted data: a JSON frame checked against the models below
(sizes bounded, fields typed), and an error the runner reports can only make the kernel
fail (its outcome must be one of RUNNER_FAILURES). A runner that dies, answers late, or
sends something that is not one of our frames is a typed failure (`KernelFailure`), and
the judge goes on to write its verdict.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from epiforge.eval import channel
from epiforge.eval.isolation import STDERR_TAIL, clean_env, kill_group

#: outcomes a runner may report for its kernel (anything else is read as RUNTIME_ERROR)
RUNNER_FAILURES = frozenset({"COMPILE_ERROR", "RUNTIME_ERROR", "STATIC_REJECTED"})


class KernelFailure(Exception):
    """The kernel failed (as the runner reported, or as its process behaved): outcome and one line."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome, self.message = outcome, message


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CompileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epilogue: str = Field(max_length=300)
    config: str = Field(max_length=300)
    mode: str | None = Field(None, max_length=50)
    ok: bool
    seconds: float
    error: str | None = Field(None, max_length=4000)


class OutputSeen(BaseModel):
    """What the runner saw of one returned output."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(max_length=100)  # "tensor", "missing", or the value's type name
    shape: list[int] | None = Field(None, max_length=16)
    dtype: str | None = Field(None, max_length=50)
    device: str | None = Field(None, max_length=20)
    stride: list[int] | None = Field(None, max_length=16)
    contiguous: bool | None = None
    copied: bool = False


class Delivered(_Reply):
    """A call's (or a collect's) answer: what came back and what the runner noticed."""

    returned: str = Field(max_length=100)
    outputs: dict[str, OutputSeen] = Field(default_factory=dict, max_length=64)
    extra: list[str] = Field(default_factory=list, max_length=20)
    launched: list[str] = Field(default_factory=list, max_length=10_000)
    violations: list[str] = Field(default_factory=list, max_length=10_000)


class Profiled(_Reply):
    launches: list[tuple[str, int | None]] = Field(max_length=10_000)
    stream: int | None = None
    recorded: bool = False  # a CPU runner's primitives record, not a profiler's kernels


class Timed(_Reply):
    us: float = Field(ge=0)


#: what a runner's environment may set apart from the judge's and still be served by a spare
#: (eval/runner.py become_runner): names read after the spare's fork (the caches, the compile
#: target, HOME and TMPDIR), never at start-up or by torch's import
LATE_ENV = frozenset({"HOME", "TMPDIR", "QUACK_CACHE_DIR", "TRITON_CACHE_DIR", "CUTE_DSL_CACHE_DIR",
                      "EPIFORGE_SHARED_CACHES", "EPIFORGE_CROSS_COMPILE", "EPIFORGE_ALSO_COMPILE", "CUTE_DSL_ARCH",
                      "QUACK_ARCH"})


def _take_spare(env: dict) -> tuple[int, socket.socket] | None:
    """A spare runner this judge forked (eval/runner.py fork_spares) that can serve `env`, or None."""
    runner = sys.modules.get("epiforge.eval.runner")
    spares = getattr(runner, "SPARES", None)
    names = (set(env) | set(os.environ)) - LATE_ENV
    if not spares or any(env.get(k) != os.environ.get(k) for k in names):
        return None
    return spares.pop(0)


class ForkedChild:
    """A spare runner as `subprocess.Popen` shows a child: pid, wait(timeout), returncode
    (negative: the signal that ended it)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 255
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"runner {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode


class KernelProcess:
    """One runner for one candidate, started in `workdir` (its private cwd and HOME): a
    spare the judge forked where one fits (eval/runner.py fork_spares), else a new process."""

    def __init__(self, workdir: Path, *, deadline: float, cpu_bytes: int | None = None,
                 extra_env: dict | None = None, on_progress=None, cuda: str | None = None,
                 believe_progress: bool = True):
        """believe_progress=False: this process's progress frames are dropped, neither shown
        as a stage nor taken to mean it is compiling (a death then is its RUNTIME_ERROR): a
        describer, which holds the kernel's code and never builds. A one-process runner's
        are believed, the known limit of that mode (tests/exploits/forged_compile_frame.py)."""
        self.deadline = deadline
        self.believe_progress = believe_progress
        self.on_progress = on_progress or (lambda stage: None)
        self.compiled: list[dict] = []
        self.building = False
        workdir.mkdir(parents=True, exist_ok=True)
        self.stderr_path = workdir.parent / f"{workdir.name}.stderr"  # beside its dir: not the kernel's to write
        env = clean_env({"HOME": str(workdir), **private_caches(workdir), **(extra_env or {})})
        spare = None if cuda else _take_spare(env)
        if spare is not None:
            self.stderr_path.write_bytes(b"")
            pid, self.sock = spare
            self.proc = ForkedChild(pid)
            try:
                channel.send(self.sock, {"op": "become", "cwd": str(workdir), "env": env,
                                         "stderr": str(self.stderr_path), "cpu_bytes": int(cpu_bytes) if cpu_bytes else None})
            except OSError:  # the spare is gone (killed from outside): a new process instead
                self.kill()
                self.proc.wait()
                self.sock.close()
            else:
                self.sandbox = str(self.ask({"op": "ping"}, stage="load").get("sandbox", "unknown"))[:200]
                return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        args = [sys.executable, "-m", "epiforge.eval.runner", "--sock", str(theirs.fileno()), "--parent", str(os.getpid())]
        if cpu_bytes:
            args += ["--cpu-bytes", str(int(cpu_bytes))]
        if cuda:
            args += ["--cuda", cuda]
        with open(self.stderr_path, "wb") as err:
            try:
                self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=err, stderr=err, cwd=workdir,
                                             env=env, pass_fds=(theirs.fileno(),), start_new_session=True)
            finally:
                theirs.close()
        self.sock = ours
        self.sandbox = str(self.ask({"op": "ping"}, stage="load").get("sandbox", "unknown"))[:200]

    # ---- asking -------------------------------------------------------------------------------

    def ask(self, message: dict, fds: list[int] = (), *, stage: str) -> dict:
        """Send one operation and return its answer (a dict), or raise KernelFailure."""
        try:
            channel.send(self.sock, message, list(fds))
            while True:
                frame, got = channel.receive(self.sock, self.deadline)
                for fd in got:  # the runner has no business sending descriptors
                    os.close(fd)
                if "progress" in frame:
                    if self.believe_progress:
                        self.building = frame["progress"] == "compile"
                        self.on_progress(str(frame["progress"])[:40])
                    continue
                break
        except channel.ChannelTimeout:
            self.kill()
            raise KernelFailure("TIMEOUT", f"no answer from the kernel's process in time (during {stage}); "
                                           "its process group was killed") from None
        except channel.ChannelClosed:
            raise KernelFailure(*self._death(stage)) from None
        except channel.ChannelError as e:
            self.kill()
            raise KernelFailure("RUNTIME_ERROR", f"the kernel's process broke the protocol during {stage}: {e}") from None
        if frame.get("reply") != message["op"]:
            self.kill()
            raise KernelFailure("RUNTIME_ERROR", f"the kernel's process answered {str(frame.get('reply'))[:40]!r} "
                                                 f"to {message['op']!r} (a forged or out-of-order frame)")
        self._note_compiles(frame.get("compiled"))
        error = frame.get("error")
        if error is not None:
            outcome = error.get("outcome") if isinstance(error, dict) else None
            text = str(error.get("message", "")) if isinstance(error, dict) else str(error)
            raise KernelFailure(outcome if outcome in RUNNER_FAILURES else "RUNTIME_ERROR", text[:600])
        return frame

    def parse(self, model, frame: dict, stage: str):
        try:
            return model.model_validate(frame)
        except ValidationError as e:
            self.kill()
            first = e.errors()[0]
            raise KernelFailure("RUNTIME_ERROR", f"the kernel's process sent a malformed answer during {stage} "
                                                 f"({'.'.join(map(str, first['loc']))}: {first['msg']})") from None

    def _note_compiles(self, entries) -> None:
        if not isinstance(entries, list):
            return
        for raw in entries[:100]:
            try:
                self.compiled.append(CompileEntry.model_validate(raw).model_dump(exclude_none=True))
            except ValidationError:
                continue

    def _death(self, stage: str) -> tuple[str, str]:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.wait()
        if code is not None and code < 0:
            try:
                why = signal.Signals(-code).name
            except ValueError:
                why = f"signal {-code}"
        else:
            why = f"exit code {code}"
        if self.building:
            return "COMPILE_ERROR", f"the compiler crashed ({why}) while building the kernel"
        return "RUNTIME_ERROR", f"the kernel's process died ({why}) during {stage}"

    # ---- ending -------------------------------------------------------------------------------

    def kill(self) -> None:
        kill_group(self.proc)

    def close(self) -> None:
        try:
            channel.send(self.sock, {"op": "exit"})
        except (channel.ChannelClosed, OSError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        self.proc.wait()
        self.sock.close()

    def stderr_tail(self) -> str:
        try:
            return self.stderr_path.read_bytes()[-STDERR_TAIL:].decode(errors="replace")
        except OSError:
            return ""


class DescribedKernel:
    """A candidate as two processes (the judge's launcher mode): `describer`, a runner with
    the kernel loaded, only describes it, on the shapes of each input set (it never holds a
    value); `launcher`, a runner that loads no kernel file, runs each description on the
    judge's buffers with the primitives' code and reports what it launched itself. It answers
    the judge as one KernelProcess: `put` first asks the describer for the set's program and
    hands it to the launcher with the inputs; everything else is the launcher's.
    A kernel is described once per set of shapes, dtypes and scalars (all a description may
    depend on): every later input set of the same shapes runs that same program, so what
    the numerics trials checked is what the timed repetitions run."""

    def __init__(self, describer: KernelProcess, launcher: KernelProcess, consts: list[str], device: str):
        self.describer, self.launcher, self.consts = describer, launcher, list(consts)
        self.device = device  # the launcher's: the kernel is described as it would run there
        self.sandbox = launcher.sandbox
        self.programs: dict[str, str] = {}  # by the specs' JSON: each description, asked for once

    @property
    def compiled(self) -> list[dict]:
        return self.launcher.compiled

    def ask(self, message: dict, fds: list[int] = (), *, stage: str) -> dict:
        if message.get("op") == "put":
            specs = {r["name"]: {"shape": list(r["shape"]), "stride": _contiguous_strides(r["shape"]), "dtype": r["dtype"]}
                     for r in message["tensors"]}
            specs.update({k: {"value": v} for k, v in message.get("scalars", {}).items()})
            key = json.dumps(specs, sort_keys=True)
            if key not in self.programs:
                described = self.describer.ask({"op": "describe", "specs": specs, "consts": self.consts,
                                                "device": self.device}, stage=stage)
                if not isinstance(described.get("program"), str):
                    raise KernelFailure("RUNTIME_ERROR", f"the kernel's process sent no description during {stage}")
                self.programs[key] = described["program"]
            message = {**message, "program": self.programs[key]}
        return self.launcher.ask(message, fds, stage=stage)

    def parse(self, model, frame: dict, stage: str):
        return self.launcher.parse(model, frame, stage)

    def kill(self) -> None:
        self.describer.kill()
        self.launcher.kill()

    def close(self) -> None:
        self.describer.close()
        self.launcher.close()

    def stderr_tail(self) -> str:
        return self.describer.stderr_tail() + self.launcher.stderr_tail()


def _contiguous_strides(shape) -> list[int]:
    strides, n = [], 1
    for size in reversed(list(shape)):
        strides.append(n)
        n *= max(int(size), 1)
    return strides[::-1]


def private_caches(workdir: Path) -> dict:
    """The runner's compile caches, in its own (only writable) dir: every object of this
    machine's quack and Triton caches linked in, so nothing is rebuilt, and whatever the
    runner writes there is gone with the evaluation (no later one ever reads it)."""
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {"TMPDIR": str(tmp)}
    quack = Path(os.environ.get("QUACK_CACHE_DIR") or Path(tempfile.gettempdir()) / getpass.getuser() / "quack_cache")
    env["QUACK_CACHE_DIR"] = str(_link_farm(quack, workdir / "quack-cache", depth=2))
    triton = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    # depth 2: a key's folder is the runner's own (Triton writes tmp.pid_* folders into it while it
    # compiles), its files links
    env["TRITON_CACHE_DIR"] = str(_link_farm(triton, workdir / "triton-cache", depth=2))
    shared = [quack, triton]
    if os.environ.get("CUTE_DSL_CACHE_DIR"):
        dsl = Path(os.environ["CUTE_DSL_CACHE_DIR"])
        env["CUTE_DSL_CACHE_DIR"] = str(_link_farm(dsl, workdir / "cute-dsl-cache", depth=1))
        shared.append(dsl)
    # what the runner's sandbox keeps read-only where it cannot make the whole filesystem so
    env["EPIFORGE_SHARED_CACHES"] = os.pathsep.join(str(p) for p in shared)
    return env


def _link_farm(source: Path, dest: Path, depth: int) -> Path:
    """dest mirrors source's folders down to `depth`, with links to what lies below.

    Lock files and half-written temp files are not linked: quack opens its per-key
    `{sha}.lock` for writing before it compiles a key whose object is missing, and a link to
    the shared (read-only in the sandbox) lock made that open fail with EROFS whenever
    another process had compiled, or was compiling, the same key. The runner makes its own
    locks in its own dir."""
    dest.mkdir(parents=True, exist_ok=True)
    if depth == 0 or not source.is_dir():
        return dest
    try:
        entries = list(source.iterdir())
    except OSError:
        return dest
    for entry in entries:
        if _is_lock_or_temp(entry.name):
            continue
        if depth > 1 and entry.is_dir():
            _link_farm(entry, dest / entry.name, depth - 1)
        elif not (dest / entry.name).exists():
            try:
                (dest / entry.name).symlink_to(entry)
            except OSError:
                pass
    return dest


def _is_lock_or_temp(name: str) -> bool:
    """A cache entry that belongs to the process that made it: a lock, or an object still
    being written (quack exports to `{sha}.o.tmp.{pid}` and renames; Triton writes a key's
    files into `tmp.pid_*` folders and renames them)."""
    return name.endswith(".lock") or ".tmp." in name or name.endswith(".tmp") or name.startswith("tmp.")


def remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())
