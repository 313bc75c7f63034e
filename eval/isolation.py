"""Processes: the judge and the kernel runner, how they start, and how they end.

    harness (evaluate())  ->  judge (python -m epiforge.eval.judge)  ->  runner (python -m epiforge.eval.runner)
                              trusted: seed, references,        untrusted: the candidate's
                              tolerance, verdict                 code; holds none of those

Both children start in a new session (their own process group), with an allowlisted
environment (no API keys or other secrets), no core dumps, a file-size limit, and a
parent-death signal: the judge gets SIGTERM when the harness dies (it then kills the
runner's group and removes the evaluation's temp dir), the runner gets SIGKILL when the
judge dies. The judge makes itself non-dumpable, so a runner of the same user cannot read
or write its memory through /proc or ptrace; the runner shuts itself in namespaces before
anything else (sandbox(): no capability over processes outside, so not over a root
judge either; a read-only filesystem but its own dir; no network), and just before the
kernel loads it forbids itself new Unix-domain sockets (forbid_unix_sockets: a service's
socket file stays unreachable through the read-only mount). The runner also gets a
CPU memory limit and PYTHONHASHSEED pinned (nothing of its behaviour may depend on a
per-process hash seed).
The harness reads the judge's frames (eval/judge.py) on a private pipe until it closes or
the evaluation's time is up, then kills the judge's group, whatever happened; Ctrl-C
(KeyboardInterrupt) does the same on its way out.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from epiforge import IMPORT_ROOT
from epiforge.eval import judge_zygote

STDERR_TAIL = 4000
MAX_CHANNEL_BYTES = 32 * 2**20
FILE_SIZE_LIMIT = 2 * 2**30  # stderr spam or a runaway write stops here (SIGXFSZ)
#: the runner's string-hash seed: fixed, so a kernel's behaviour cannot vary with it
RUNNER_HASH_SEED = "0"
TEMP_PREFIX = "epiforge-eval-"

#: the CPU math libraries' own sources of run-to-run variation, pinned in the judge and the
#: runner alike: MKL's Conditional Numerical Reproducibility (STRICT: results do not depend
#: on memory alignment either) and no dynamic thread counts (OpenMP's, MKL's). The thread
#: count itself is pinned by clean_env (this machine's usable cores unless set).
NUMERICS_PINS = {"MKL_CBWR": "AUTO,STRICT", "MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"}

#: the children's environment is these names and prefixes of ours, minus anything secret-looking
ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TMPDIR", "TZ", "PYTHONPATH",
    "LD_LIBRARY_PATH", "VIRTUAL_ENV", "XDG_CACHE_HOME", "CC", "CXX", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG",
})
ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NV_", "CUTE_DSL_", "CUTLASS_", "QUACK_", "TRITON_", "TORCH_", "PYTORCH_",
                "EPIFORGE_")
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "PRIVATE", "SESSION")

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4


def clean_env(extra: dict | None = None, base: dict | None = None) -> dict:
    """A child's environment: allowlisted names of `base` (ours by default) minus anything
    that looks like a secret, plus `extra`."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items()
           if (k in ENV_NAMES or k.startswith(ENV_PREFIXES)) and not any(m in k.upper() for m in SECRET_MARKERS)}
    # where epiforge imports from first; keep the rest (on the GPU machine quack and pydantic live there)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(IMPORT_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([str(IMPORT_ROOT), *rest])
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONHASHSEED"] = RUNNER_HASH_SEED
    env.update(NUMERICS_PINS)
    threads = env.get("OMP_NUM_THREADS") or str(len(os.sched_getaffinity(0)))
    env.setdefault("OMP_NUM_THREADS", threads)
    env.setdefault("MKL_NUM_THREADS", threads)
    env.update(extra or {})
    return env


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> bool:
    try:
        return _libc().prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def make_undumpable() -> bool:
    """This process's memory becomes unreadable to other processes of its user (Linux)."""
    return _prctl(_PR_SET_DUMPABLE, 0)


def make_dumpable() -> bool:
    """Undo make_undumpable in a child forked from the judge (a spare runner): a process
    starts dumpable, and its user namespace's id maps are written through /proc/self."""
    return _prctl(_PR_SET_DUMPABLE, 1)


def setup_child(parent: int, *, death_signal: int, cpu_bytes: int | None = None) -> None:
    """A child's first act (the judge's and the runner's main): limits, and death_signal
    when its parent dies; a parent that died before the signal was armed ends it now.
    Done in the child itself, not in a preexec_fn (the parent may have threads)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
    if cpu_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (cpu_bytes, cpu_bytes))
    _prctl(_PR_SET_PDEATHSIG, death_signal)
    if os.getppid() != parent:
        os._exit(1)


_CLONE_NEWUSER, _CLONE_NEWNS, _CLONE_NEWNET = 0x10000000, 0x00020000, 0x40000000
_MS_REC, _MS_PRIVATE, _MS_BIND = 0x4000, 1 << 18, 4096
_AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
_SYS_MOUNT_SETATTR = 442  # x86-64 and arm64


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def sandbox(writable: Path, *, whole_fs: bool = True, readonly: list[str] = ()) -> str:
    """Shut this (single-threaded, not yet torch-importing) process in: a user namespace of
    its own (it keeps its uid for files, but holds no capability over the processes outside,
    so it cannot read or write the judge's memory even when the judge is root), a mount
    namespace where the filesystem is read-only except `writable` (the kernel cannot change
    the repo, the tasks, a cache the next evaluation reads), and a network namespace with no
    way out. whole_fs=False (CUDA: its driver fails on a read-only root, seen on the H200):
    only the `readonly` trees are made read-only (the repo, the Python paths, the shared
    caches). Returns what it achieved, in words; where the kernel forbids unprivileged
    namespaces it achieves less, and says so (the Result records it)."""
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    flags = None
    for want in (_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET, _CLONE_NEWUSER | _CLONE_NEWNS):
        if libc.unshare(want) == 0:
            flags = want
            break
    if flags is None:
        return f"none (unshare: {os.strerror(ctypes.get_errno())})"
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except OSError as e:
        return f"user namespace without an id map ({e.strerror})"

    def set_ro(path: bytes, on: bool) -> int:
        attr = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0) if on else _MountAttr(0, _MOUNT_ATTR_RDONLY, 0, 0)
        return libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path, _AT_RECURSIVE, ctypes.byref(attr),
                            ctypes.sizeof(_MountAttr))

    def bind(path: bytes) -> int:
        return libc.mount(path, path, None, _MS_BIND | _MS_REC, None)

    target = str(writable).encode()
    failed = libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0
    if whole_fs:
        failed = failed or bind(target) != 0 or set_ro(b"/", True) != 0 or set_ro(target, False) != 0
        what = "read-only filesystem but its own dir"
    else:
        trees = sorted({str(Path(p).resolve()) for p in readonly if p and Path(p).is_dir()})
        trees = [t for t in trees if not str(writable.resolve()).startswith(t + "/") and t != str(writable.resolve())] \
            + [t for t in trees if str(writable.resolve()).startswith(t + "/")]
        for tree in trees:
            failed = failed or bind(tree.encode()) != 0 or set_ro(tree.encode(), True) != 0
        if any(str(writable.resolve()).startswith(t + "/") for t in trees):
            failed = failed or bind(target) != 0 or set_ro(target, False) != 0
        what = f"read-only repo, Python paths and shared caches ({len(trees)} trees)"
    if failed:
        return f"user namespace; the filesystem stays writable ({os.strerror(ctypes.get_errno())})"
    os.chdir(writable)  # the old cwd is the directory under the new mount: enter through the new one
    net = "no network" if flags & _CLONE_NEWNET else "the network reachable"
    return f"user and mount namespaces: {what}, {net}"


#: per machine: (seccomp's audit arch, the seccomp, socket and io_uring_setup syscall numbers)
_SYSCALLS = {"x86_64": (0xC000003E, 317, 41, 425), "aarch64": (0xC00000B7, 277, 198, 425)}
_PR_SET_NO_NEW_PRIVS = 38
_X32_BIT = 0x40000000
#: what forbid_unix_sockets achieves, in words (the Result's environment records it)
NO_UNIX_SOCKETS = "no new Unix-domain sockets, no io_uring (seccomp)"


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def forbid_unix_sockets() -> str:
    """From now on no thread of this process may open a Unix-domain socket (EACCES), nor set
    up io_uring (whose socket operation bypasses socket()): a filesystem socket of a service
    outside the runner (a database, a container daemon) stays unreachable, since the
    read-only mount does not stop connect(). Sockets made before (the judge's channel, a
    socketpair) keep working; other families are the network namespace's business. A
    seccomp filter on every thread (TSYNC), with no_new_privs; returns what it achieved."""
    import platform
    import struct

    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return f"none (no filter written for {platform.machine()})"
    audit_arch, nr_seccomp, nr_socket, nr_io_uring_setup = numbers
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | 13  # SECCOMP_RET_ALLOW; SECCOMP_RET_ERRNO | EACCES
    program = [  # (code, jump if true, jump if false, k); jumps count from the next instruction
        (ld, 0, 0, 4),                   # 0  seccomp_data.arch
        (jeq, 1, 0, audit_arch),         # 1  this machine's ABI: go on at 3
        (ret, 0, 0, allow),              # 2  another ABI: no Python here runs it
        (ld, 0, 0, 0),                   # 3  seccomp_data.nr
        (jge, 6, 0, _X32_BIT),           # 4  x32 numbers (a second door to every call): deny
        (jeq, 5, 0, nr_io_uring_setup),  # 5  io_uring_setup: deny
        (jeq, 0, 3, nr_socket),          # 6  socket: look at its family; any other call: allow
        (ld, 0, 0, 16),                  # 7  args[0], its low 32 bits: the family
        (jeq, 2, 0, 1),                  # 8  AF_UNIX: deny
        (ret, 0, 0, allow),              # 9
        (ret, 0, 0, allow),              # 10
        (ret, 0, 0, deny),               # 11
    ]
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *ins) for ins in program))
    fprog = _SockFprog(len(program), ctypes.addressof(code))
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"none (no_new_privs: {os.strerror(ctypes.get_errno())})"
    if libc.syscall(nr_seccomp, 1, 1, ctypes.byref(fprog)) != 0:  # SECCOMP_SET_MODE_FILTER, FILTER_FLAG_TSYNC
        return f"none (seccomp: {os.strerror(ctypes.get_errno())})"
    return NO_UNIX_SOCKETS


_CLONE_NEWPID = 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8


def own_pid_namespace(death_signal: int, close_in_parent: int | None = None) -> bool:
    """Go on in a PID namespace of its own (after sandbox(): it needs the user namespace):
    unshare, fork; the original process only waits and ends as the child ends (a signal
    death passed on as such), so it stays the process its parent knows; the child, PID 1
    there, mounts its own /proc and goes on, unable to see or signal any process outside.
    True in the child; False where it cannot (nothing changed)."""
    libc = _libc()
    if libc.unshare(_CLONE_NEWPID) != 0:
        return False
    pid = os.fork()
    if pid:
        if close_in_parent is not None:
            os.close(close_in_parent)  # the child holds the channel; its end must be seen as such
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those cannot be caught: already the default
                signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    _prctl(_PR_SET_PDEATHSIG, death_signal)
    libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
    return True


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---- the harness side: one judge per evaluation --------------------------------------------------


@dataclass
class JudgeRun:
    """What came back from one judge: the result of each job it was given (one job: a
    plain request; several: {"jobs": [request, ...]}, judged one after another)."""

    results: dict[int, dict] = field(default_factory=dict)
    stage: str = "static"
    stages: list[tuple[int, str]] = field(default_factory=list)  # (job, stage), in order
    broken: str | None = None  # why the channel's content could not be read
    timed_out: bool = False
    returncode: int | None = None
    stderr_tail: str = ""
    wall_s: float = 0.0

    @property
    def result(self) -> dict | None:
        """The result of a one-job run (job 0)."""
        return self.results.get(0)

    def stage_of(self, job: int) -> str:
        """The last stage job reached ("static": it never started)."""
        return next((name for j, name in reversed(self.stages) if j == job), "static")

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None


@dataclass
class Frames:
    """The judge's channel, read: each job's stages and result, or why it cannot be read."""

    stages: list[tuple[int, str]] = field(default_factory=list)
    results: dict[int, dict] = field(default_factory=dict)
    broken: str | None = None


def parse_frames(data: bytes, nonce: str, jobs: int = 1) -> Frames:
    """The judge's pipe: newline-delimited JSON frames, each with the nonce and its job's
    index ("job", 0 when absent); per job its {"stage"} frames, then one {"result"} frame,
    after which that job sends nothing more; a partial last line is ignored. Anything
    else breaks the channel there: what came before (each result a whole frame with the
    nonce) is kept, nothing after it is read; a one-job run's caller believes no result
    once the channel broke, a several-job run's caller gives the jobs left a new judge."""
    out = Frames()
    for raw in data.split(b"\n")[:-1]:
        try:
            frame = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return Frames(out.stages, out.results, "a line on the judge's channel is not a frame")
        if not isinstance(frame, dict) or frame.get("nonce") != nonce:
            return Frames(out.stages, out.results, "a frame on the judge's channel does not carry its nonce")
        job = frame.get("job", 0)
        if type(job) is not int or not 0 <= job < jobs:
            return Frames(out.stages, out.results, "a frame on the judge's channel names no job of this run")
        if job in out.results:
            return Frames(out.stages, out.results, "frames after the result")
        if "stage" in frame:
            out.stages.append((job, str(frame["stage"])))
        elif isinstance(frame.get("result"), dict):
            out.results[job] = frame["result"]
        else:
            return Frames(out.stages, out.results, "an unknown frame on the judge's channel")
    return out


def run_judge(request: dict, *, timeout_s: float, extra_env: dict | None = None,
              module: str = "epiforge.eval.judge", on_stage=None, on_result=None) -> JudgeRun:
    """Start the judge, hand it the request (with the secret seed) on stdin, read its
    frames until it closes the pipe or the time is up; always kill its group and remove
    the evaluation's temp dir on the way out (Ctrl-C included). request: one job, or
    {"jobs": [job, ...]}, each with its own timeout_s (timeout_s here bounds them all).
    on_stage(name) hears a one-job run's stages as they start, on_stage(job, name) those
    of a run of several jobs; on_result(job, result) hears each job's result as it comes."""
    nonce = secrets.token_hex(16)
    started = time.monotonic()
    jobs = len(request["jobs"]) if "jobs" in request else 1
    hear = None if on_stage is None else on_stage if "jobs" in request else (lambda job, name: on_stage(name))
    out = JudgeRun()
    tmp = tempfile.mkdtemp(prefix=TEMP_PREFIX)
    read_fd, write_fd = os.pipe()
    proc = None
    data, too_much = b"", False
    try:
        err_path = Path(tmp) / "judge.stderr"
        with open(err_path, "wb") as err:
            args = ["--result-fd", str(write_fd), "--tmp", tmp, "--parent", str(os.getpid())]
            env = clean_env(extra_env)
            try:
                # a judge forked by a warm zygote where the harness asked for them (judge_zygote.warm_judges)
                proc = judge_zygote.start_judge(args, env=env, cwd=tmp, stderr_fd=err.fileno(), pass_fd=write_fd,
                                                module=module)
                if proc is None:
                    proc = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.PIPE, stdout=err,
                                            stderr=err, cwd=tmp, env=env, pass_fds=(write_fd,), start_new_session=True)
            finally:
                os.close(write_fd)
            try:
                proc.stdin.write(json.dumps({**request, "nonce": nonce, "timeout_s": timeout_s}).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            # the judge enforces each job's time itself (it reports which stage ran out); this is the backstop
            data, too_much = _read_until_eof(read_fd, started + timeout_s + 30, nonce, jobs, hear,
                                             on_result if "jobs" in request else None)
            complete = len(parse_frames(data, nonce, jobs).results) == jobs
            out.timed_out = not complete and time.monotonic() >= started + timeout_s + 30
            try:
                proc.wait(timeout=0.1 if out.timed_out else 10)
            except subprocess.TimeoutExpired:
                pass
        out.stderr_tail = err_path.read_bytes()[-STDERR_TAIL:].decode(errors="replace")
    finally:
        if proc is not None:
            kill_group(proc)
            out.returncode = proc.wait()
        os.close(read_fd)
        shutil.rmtree(tmp, ignore_errors=True)
    frames = parse_frames(data, nonce, jobs)
    out.stages, out.results, out.broken = frames.stages, frames.results, frames.broken
    if too_much:
        out.results, out.broken = {}, f"more than {MAX_CHANNEL_BYTES} bytes on the judge's channel"
    out.stage = out.stages[-1][1] if out.stages else "static"
    out.wall_s = round(time.monotonic() - started, 3)
    return out


def _read_until_eof(fd: int, deadline: float, nonce: str, jobs: int, hear, on_result) -> tuple[bytes, bool]:
    chunks, size, seen, told = [], 0, 0, set()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b"".join(chunks), False
        ready, _, _ = select.select([fd], [], [], min(remaining, 0.5))
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:  # EOF: the judge is gone
            return b"".join(chunks), False
        chunks.append(chunk)
        size += len(chunk)
        if hear is not None or on_result is not None:
            frames = parse_frames(b"".join(chunks), nonce, jobs)
            for job, name in frames.stages[seen:] if hear is not None else []:
                hear(job, name)
            seen = len(frames.stages)
            for job in sorted(set(frames.results) - told) if on_result is not None else []:
                on_result(job, frames.results[job])
                told.add(job)
        if size > MAX_CHANNEL_BYTES:
            return b"".join(chunks), True
