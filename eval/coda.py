"""The `coda` baseline: the kernels of CODA's authors (coda-kernels 0.2, HanGuo97/coda-kernels)
timed beside ours, in the same interleaved run.

coda-kernels pins quack-kernels 0.6.1 with nvidia-cutlass-dsl 4.6.0; epiforge pins quack
0.6.5 with 4.7.1. Two quacks cannot share a process, so CODA runs in a worker of its own
(eval/coda_worker.py) whose import path starts with CODA's environment: a folder named by
EPIFORGE_CODA_ENV, holding coda-kernels and its pinned dependencies (`python -m
epiforge.eval.coda install DIR` makes one). The worker maps the judge's input tensors
(CUDA IPC, eval.channel: no copy through a socket) and times each call itself with the
judge's procedure (eval.timing.timed_call: L2 flushed, the GPU heated, CUDA events around
the call), one call per repetition in the judge's shuffled order. What that costs the
measurement: nothing inside the events (the worker's lead runs in its own CUDA context
before them, so the switch between the two processes' contexts falls outside); the judge
holds one more copy of each input set (the shared copies the worker maps), and the worker
its own flush buffer and heater. Its outputs of the first input set are checked against the
task's reference with the task's tolerance before anything is timed: a mapping that does
not compute the task is left out, never timed.

Where CODA computes a task (eval/coda_worker.py CONVENTIONS says how, and what differs):
k3, k3hf, k8, k9, k9l, qkn. Elsewhere the baseline is left out with the reason.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from epiforge.eval.coda_worker import CONVENTIONS, ROUNDED

ENV_VAR = "EPIFORGE_CODA_ENV"
#: what `install` puts in CODA's environment: coda-kernels and the versions it pins, and its
#: imports' packages (torch, triton, apache-tvm-ffi and torch-c-dlpack-ext come from epiforge's)
PACKAGES = ("coda-kernels==0.2", "quack-kernels==0.6.1", "nvidia-cutlass-dsl==4.6.0",
            "nvidia-cutlass-dsl-libs-base==4.6.0", "nvidia-cutlass-dsl-libs-core==4.6.0", "fla-core==0.6.0",
            "einops", "ipdb")
#: the CUDA-specific part of the CuTe DSL, one of these (matching torch's CUDA)
CUDA_LIBS = {"12": "nvidia-cutlass-dsl-libs-cu12==4.6.0", "13": "nvidia-cutlass-dsl-libs-cu13==4.6.0"}
#: an output CODA rounds through an intermediate (ROUNDED) may be off the task's reference by at
#: most this RMS error, relative to the reference's RMS: a rounding of 16-bit precision is ~0.4 %
#: (2^-8), a wrong mapping (direction, weight, layout) is of the order of 100 %
ROUNDED_RMS = 0.01
SETUP_TIMEOUT_S = 900.0  # CODA autotunes every config of its table on first use
CALL_TIMEOUT_S = 120.0


class CodaUnavailable(Exception):
    """Why the coda baseline is left out here (one line)."""


def environment() -> Path:
    """CODA's environment folder, or CodaUnavailable saying what to do."""
    where = os.environ.get(ENV_VAR)
    if not where:
        raise CodaUnavailable(f"coda-kernels is not set up: set {ENV_VAR} to a folder made by "
                              "`python -m epiforge.eval.coda install DIR`")
    path = Path(where)
    if not (path / "coda").is_dir() or not (path / "quack").is_dir():
        raise CodaUnavailable(f"{ENV_VAR}={where} holds no coda-kernels and quack "
                              "(make it with `python -m epiforge.eval.coda install DIR`)")
    return path


def worker_path(env_dir: Path, ours: list[str]) -> list[str]:
    """The worker's import path: CODA's environment (its CuTe DSL's packages first, as their
    .pth file would put them), then ours without our CuTe DSL's packages folders, so that
    `quack`, `cutlass` and `nvidia_cutlass_dsl` all resolve to CODA's versions."""
    mine = [str(env_dir / "nvidia_cutlass_dsl" / "dsl_packages"), str(env_dir)]
    return mine + [p for p in ours if p and Path(p).name != "dsl_packages" and p not in mine]


def rounded_check(out, exact) -> tuple[bool, str]:
    """An output CODA computes through a rounded intermediate (ROUNDED): its RMS error within
    ROUNDED_RMS of the reference's RMS, every element finite. (ok, what was measured)."""
    import torch

    out, exact = out.double(), exact.double()
    if out.shape != exact.shape:
        return False, f"shape {tuple(out.shape)}, expected {tuple(exact.shape)}"
    if not torch.isfinite(out).all():
        return False, "a non-finite element"
    err = (out - exact).abs()
    rel = float(err.pow(2).mean().sqrt() / exact.pow(2).mean().sqrt().clamp_min(1e-30))
    text = f"max error {float(err.max()):.3g}, RMS error {rel:.3%} of the reference's RMS"
    return rel <= ROUNDED_RMS, text + ("" if rel <= ROUNDED_RMS else f", over {ROUNDED_RMS:.0%}")


class CodaBaseline:
    """A started worker holding one task's input sets. timed_us(j) is one timed call of set
    j (microseconds, the worker's CUDA events); refresh(j) copies set j's variable inputs
    again after the judge drew new values; close() ends the worker."""

    def __init__(self, task, dims: dict, input_sets: list[dict], device: str):
        if task.id not in CONVENTIONS:
            raise CodaUnavailable("CODA has no kernel for this task")
        if device != "cuda":
            raise CodaUnavailable("CODA's kernels need a CUDA GPU")
        env_dir = environment()
        from epiforge.eval.isolation import clean_env

        self.task, self.dims, self.inputs = task, dims, input_sets
        self.note = f"coda-kernels: {CONVENTIONS[task.id]}"
        env = clean_env()
        env["PYTHONPATH"] = os.pathsep.join(worker_path(env_dir, env["PYTHONPATH"].split(os.pathsep)))
        cache = Path(env.get("CUTE_DSL_CACHE_DIR") or "/tmp/cute-dsl-cache") / "coda"
        env["CUTE_DSL_CACHE_DIR"] = str(cache)  # another DSL version: never the same cache as ours
        env.pop("QUACK_CACHE_DIR", None)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock, self.proc, self.failed, self.shared = mine, None, None, []
        self._err = bytearray()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "epiforge.eval.coda_worker", str(theirs.fileno()),
                                          str(os.getpid())], pass_fds=(theirs.fileno(),), env=env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        finally:
            theirs.close()
        threading.Thread(target=self._drain, daemon=True).start()
        try:
            self._start(task, dims, input_sets)
        except BaseException:
            self.close()
            raise

    def _start(self, task, dims: dict, input_sets: list[dict]) -> None:
        from epiforge.eval import channel

        hello = self._reply(120.0)
        self.versions = hello.get("versions") or {}
        if "error" in hello:
            raise CodaUnavailable(hello["error"])
        self.note += f" ({', '.join(f'{k} {v}' for k, v in self.versions.items())})"
        # the worker's copies of every input set, in the judge's shared pool
        refs = []
        self.variable = [t.name for t in task.inputs if not t.constant]
        for x in input_sets:
            own, wire = {}, []
            for t in task.inputs:
                copy, _ = channel.shared_empty(x[t.name].shape, x[t.name].dtype, "cuda")
                copy.copy_(x[t.name])
                own[t.name] = copy
                wire.append(channel.describe(t.name, copy, None, None).model_dump())
            self.shared.append(own)
            refs.append(wire)
        scalars = {s.name: input_sets[0][s.name] for s in task.scalars}
        import torch

        torch.cuda.synchronize()
        self._ask({"op": "setup", "task": task.id, "dims": dims, "scalars": scalars, "sets": refs}, SETUP_TIMEOUT_S)
        self._check()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self._err += line
            del self._err[:-4000]

    def _reply(self, timeout_s: float) -> dict:
        from epiforge.eval import channel

        try:
            msg, fds = channel.receive(self.sock, time.monotonic() + timeout_s)
        except (channel.ChannelClosed, channel.ChannelTimeout, channel.ChannelError) as e:
            tail = bytes(self._err).decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise CodaUnavailable(f"CODA's worker: {e}" + (f" ({tail[0][:200]})" if tail[0] else "")) from None
        channel._close_all(fds)
        return msg

    def _ask(self, message: dict, timeout_s: float = CALL_TIMEOUT_S) -> dict:
        from epiforge.eval import channel

        channel.send(self.sock, message)
        reply = self._reply(timeout_s)
        if "error" in reply:
            raise CodaUnavailable(f"CODA: {reply['error']}")
        return reply

    def _check(self) -> None:
        """Set 0's outputs against the task's reference, before anything is timed."""
        import torch

        from epiforge.eval.numerics import OutputBuffers, references
        from epiforge.tasks.tolerance import check_output

        bufs = OutputBuffers.for_task(self.task, self.dims, "cuda")
        names = [o.name for o in self.task.outputs]
        refs, _ = bufs.wire()
        self._ask({"op": "check", "set": 0, "outputs": refs})
        exact, lowprec = references(self.task, self.inputs[0], self.dims)
        bad, rounded = [], []
        for o in self.task.outputs:
            why = ROUNDED.get(self.task.id, {}).get(o.name)
            if why is None:
                got = check_output(o, bufs.tensors[o.name], exact[o.name], lowprec[o.name])
                if not got.ok:
                    bad.append(got.detail)
                continue
            ok, text = rounded_check(bufs.tensors[o.name], exact[o.name])
            (rounded if ok else bad).append(f"{o.name} ({why}): {text}")
        del exact, lowprec, bufs
        torch.cuda.synchronize()
        if bad:
            raise CodaUnavailable(f"its outputs are not the task's ({len(bad)} of {len(names)}): {bad[0][:300]}")
        if rounded:
            self.note += "; not held to the task's tolerance, by its convention: " + "; ".join(rounded)

    def refresh(self, j: int) -> None:
        if self.failed:
            return
        for name in self.variable:
            self.shared[j][name].copy_(self.inputs[j][name])

    def timed_us(self, j: int) -> float:
        """One timed call of set j; NaN once the worker has failed (`failed` says how: the judge
        leaves the baseline out, the kernel's verdict untouched)."""
        if self.failed:
            return float("nan")
        try:
            return float(self._ask({"op": "time", "set": j})["us"])
        except CodaUnavailable as e:
            self.failed = str(e)
            return float("nan")

    def __call__(self, j: int) -> None:  # a call the judge would time itself: never (timed_us instead)
        raise TypeError("the coda baseline is timed in its worker: use timed_us")

    def close(self) -> None:
        """End the worker (asked, then killed after 10 s) and let go of the shared copies."""
        from epiforge.eval import channel

        if self.proc is not None and self.proc.poll() is None:
            try:
                channel.send(self.sock, {"op": "close"})
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self.sock.close()
        self.shared = []


def install(target: str, cuda: str) -> int:
    """pip-install CODA's environment into `target` (a folder of its own, never an environment's
    site-packages: its quack would replace ours)."""
    cmd = [sys.executable, "-m", "pip", "install", "--target", target, "--no-deps", *PACKAGES, CUDA_LIBS[cuda]]
    deps = [sys.executable, "-m", "pip", "install", "--target", target, "ipdb"]  # ipdb's own (IPython), imported by CODA
    print(" ".join(cmd[2:]), file=sys.stderr)
    rc = subprocess.call(cmd)
    if rc == 0:
        rc = subprocess.call(deps)
    return rc


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m epiforge.eval.coda",
                                description="CODA's kernels as a baseline of `epiforge compare` (baseline coda)")
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("install", help="pip-install coda-kernels 0.2 and its pinned dependencies into DIR")
    i.add_argument("dir")
    i.add_argument("--cuda", choices=sorted(CUDA_LIBS), default="13", help="torch's CUDA major version (default 13)")
    sub.add_parser("conventions", help="what each task's mapping calls, and what differs from the task")
    args = p.parse_args(argv)
    if args.cmd == "conventions":
        for task, text in CONVENTIONS.items():
            print(f"{task}: {text}")
        return 0
    return install(args.dir, args.cuda)


if __name__ == "__main__":
    sys.exit(main())
