"""Warm judges: one process that has imported the judge forks a fresh judge per evaluation.

A harness that judges many kernels one after another (the test suite, generate's turns)
otherwise starts Python and imports torch for every judge: about 1.4 s of CPU of an
evaluation's 3-4 s on a small kernel on CI's 2-core machine. With `warm_judges()` on, the
harness starts a zygote (`python -m epiforge.eval.judge_zygote`) that imports the judge's
modules and nothing else, and asks it for each judge. Every judge is still a process of its
own, forked before it reads its request, exactly as the judge forks its spare runners
(eval/runner.py fork_spares): the zygote never holds a request, a seed, a reference or a
result, and never touches CUDA (so a judge forked from it may). What the judge does from
there on is unchanged: its own session, parent-death signal (the zygote's death; the zygote
dies with the harness), spares, runners and temp dir.

One zygote serves one environment: a judge's environment may differ from its zygote's only
in LATE_ENV (names read when a judge runs, never at import); another environment gets
another zygote (at most MAX_ZYGOTES live, the oldest closed first). A zygote that is gone
costs nothing but a judge started the plain way.
"""

from __future__ import annotations

import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

#: the judge's environment names a zygote's judges may hold other values of than the zygote
#: (read at run time, never while the modules import): where the data directory and the
#: pack screen's cache are (each test sets its own)
LATE_ENV = frozenset({"EPIFORGE_DATA_DIR", "EPIFORGE_SCREEN_CACHE"})
MAX_ZYGOTES = 2
JUDGE_MODULE = "epiforge.eval.judge"

_enabled = False
_zygotes: dict[tuple, "Zygote"] = {}
_lock = threading.Lock()


def warm_judges(on: bool = True) -> None:
    """Judge this process's evaluations in judges forked from a warm zygote (on), or each in
    a new process (off, the default; closes the live zygotes)."""
    global _enabled
    _enabled = on
    if not on:
        with _lock:
            for z in _zygotes.values():
                z.close()
            _zygotes.clear()


def start_judge(args: list[str], *, env: dict, cwd: str, stderr_fd: int, pass_fd: int, module: str):
    """A judge forked by a warm zygote for `env` (a `ForkedJudge`, which `run_judge` drives
    as it does a Popen), or None where warm judges are off or no zygote can serve: the
    caller then starts the judge the plain way."""
    if not _enabled or module != JUDGE_MODULE:
        return None
    # an audit event (sys.audit), as subprocess.Popen raises one: a judge process starts here
    # too, though this process does not fork it (the test suite's `spawns` marker counts both)
    sys.audit("epiforge.judge_zygote.fork", module)
    key = (sys.executable, tuple(sorted((k, v) for k, v in env.items() if k not in LATE_ENV)))
    with _lock:  # through the fork: a zygote is closed only while no thread is forking or waiting on it
        zygote = _zygotes.get(key)
        if zygote is None or not zygote.alive():
            if zygote is not None:
                _zygotes.pop(key).close()
            idle = [k for k, z in _zygotes.items() if not z.live]  # never one with a judge still running
            for old in idle[:max(0, len(_zygotes) + 1 - MAX_ZYGOTES)]:
                _zygotes.pop(old).close()
            zygote = _zygotes[key] = Zygote(env)
        return zygote.fork(args, env=env, cwd=cwd, stderr_fd=stderr_fd, pass_fd=pass_fd)


class ForkedJudge:
    """A judge forked by a zygote, as `run_judge` uses a Popen: pid (its own session and
    group), stdin (the request's pipe), wait(timeout) and returncode (negative: the signal
    that ended it; the zygote reaps it and says how it ended)."""

    def __init__(self, zygote: "Zygote", pid: int, stdin):
        self.zygote, self.pid, self.stdin, self.returncode = zygote, pid, stdin, None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.wait_exit(self.pid, timeout)
        return self.returncode


class Zygote:
    """The harness's end of one zygote process."""

    def __init__(self, env: dict):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock, self.exits, self.lock = ours, {}, threading.Lock()
        self.live: set[int] = set()  # its judges not yet waited for
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "epiforge.eval.judge_zygote", "--sock", str(theirs.fileno()),
                 "--parent", str(os.getpid())], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env=env, pass_fds=(theirs.fileno(),), start_new_session=True)
        finally:
            theirs.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Ends the zygote (one whose judges are all waited for: a judge's parent-death
        signal is the zygote's death)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def fork(self, args: list[str], *, env: dict, cwd: str, stderr_fd: int, pass_fd: int) -> ForkedJudge | None:
        from epiforge.eval import channel

        read_fd, write_fd = os.pipe()
        try:
            with self.lock:
                channel.send(self.sock, {"op": "judge", "args": args, "env": env, "cwd": cwd},
                             [read_fd, stderr_fd, pass_fd])
                while True:
                    frame, _ = channel.receive(self.sock, time.monotonic() + 30)
                    if "exit" in frame:
                        self.exits[int(frame["exit"])] = int(frame["code"])
                        continue
                    break
        except (OSError, channel.ChannelClosed, channel.ChannelTimeout, channel.ChannelError):
            os.close(write_fd)
            return None
        finally:
            os.close(read_fd)
        if "pid" not in frame:
            os.close(write_fd)
            return None
        self.live.add(int(frame["pid"]))
        return ForkedJudge(self, int(frame["pid"]), os.fdopen(write_fd, "wb"))

    def wait_exit(self, pid: int, timeout: float | None) -> int:
        """How judge `pid` ended, as the zygote reported it; subprocess.TimeoutExpired after
        `timeout` s; -9 (as SIGKILL) where the zygote is gone and cannot say."""
        from epiforge.eval import channel

        end = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.lock:
                if pid in self.exits:
                    self.live.discard(pid)
                    return self.exits.pop(pid)
                step = 0.2 if end is None else max(0.0, min(0.2, end - time.monotonic()))
                try:
                    ready, _, _ = select.select([self.sock], [], [], step)
                    if ready:
                        frame, _ = channel.receive(self.sock, time.monotonic() + 5)
                        if "exit" in frame:
                            self.exits[int(frame["exit"])] = int(frame["code"])
                        continue
                except (OSError, ValueError, channel.ChannelClosed, channel.ChannelTimeout, channel.ChannelError):
                    self.live.discard(pid)
                    return self.exits.pop(pid, -signal.SIGKILL)
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"judge {pid}", timeout)


# ---- the zygote process --------------------------------------------------------------------------


def _become_judge(sock: socket.socket, message: dict, fds: list[int], started: int) -> None:
    """In the forked child: the judge's own process, as `python -m epiforge.eval.judge` starts
    it (its session, cwd, stdin, stdout and stderr, environment, spare runners), then its main.
    `started`: a pipe to tell the zygote that the session exists (the harness may kill the
    judge's group from the moment it has the pid)."""
    stdin_fd, stderr_fd, result_fd = fds
    zygote = os.getppid()
    sock.close()
    os.setsid()
    os.write(started, b"s")
    os.close(started)
    os.chdir(message["cwd"])
    os.dup2(stdin_fd, 0)
    os.dup2(stderr_fd, 1)
    os.dup2(stderr_fd, 2)
    for fd in (stdin_fd, stderr_fd):
        os.close(fd)
    os.environ.clear()
    os.environ.update(message["env"])
    random.seed()  # the zygote's draws are every judge's otherwise
    started = time.monotonic()
    if os.environ.get("EPIFORGE_RUNNER_SPARES") != "0":  # as the judge's first act: before its own modules
        from epiforge.eval.runner import fork_spares

        fork_spares()
    import epiforge.eval.judge as judge

    judge._STARTED = started
    args = list(message["args"])
    args[args.index("--result-fd") + 1] = str(result_fd)  # its number here
    args[args.index("--parent") + 1] = str(zygote)  # the judge's parent-death signal is the zygote's death
    sys.exit(judge.main(args))


def main(argv=None) -> int:
    import argparse

    from epiforge.eval.isolation import setup_child

    ap = argparse.ArgumentParser()
    ap.add_argument("--sock", type=int, required=True)
    ap.add_argument("--parent", type=int, required=True)
    args = ap.parse_args(argv)
    setup_child(args.parent, death_signal=signal.SIGKILL)
    # what a judge has when it forks its spares, and no more (the spares are forked from the
    # judge before it imports its own modules, so that a runner holds nothing of the judge's:
    # tests/exploits/frame_walk_finds_nothing.py); never initialises CUDA here
    import torch  # noqa: F401

    import epiforge.eval.runner  # noqa: F401

    from epiforge.eval.runner import warm_imports

    warm_imports()  # once here, for every judge's spares

    from epiforge.eval import channel

    sock = socket.socket(fileno=args.sock)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        ready, _, _ = select.select([sock, *children], [], [])
        for fd in [fd for fd in ready if fd in children]:
            pid = children.pop(fd)
            os.close(fd)
            _, status = os.waitpid(pid, 0)
            channel.send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if sock not in ready:
            continue
        try:
            message, fds = channel.receive(sock, time.monotonic() + 5)
        except (channel.ChannelClosed, channel.ChannelTimeout, channel.ChannelError, OSError):
            for pid in children.values():  # the harness closed this zygote: its judges end first
                os.waitpid(pid, 0)
            return 0
        if message.get("op") != "judge" or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            channel.send(sock, {"error": "not a judge request"})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        started_r, started_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(started_r)
                _become_judge(sock, message, fds, started_w)
            except SystemExit as e:
                os._exit(e.code if isinstance(e.code, int) else 1)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(1)
        for fd in (*fds, started_w):
            os.close(fd)
        os.read(started_r, 1)  # its own session now (or it died: EOF)
        os.close(started_r)
        children[os.pidfd_open(pid)] = pid
        channel.send(sock, {"pid": pid})


if __name__ == "__main__":
    sys.exit(main())
