"""The kernel runner: the one process where a candidate's code runs (untrusted).

    python -m epiforge.eval.runner --sock FD      (started by the judge, eval/judge.py)

It holds nothing that judges the kernel: no seed, no task, no reference, no tolerance, no
channel to the harness. It receives inputs the judge made (shared memory, eval/channel.py),
calls the kernel, copies what the kernel returned into buffers the judge owns, and says
what it saw. Whatever the kernel does to this process gains it nothing: the judge checks
every value itself, and a missing, malformed or late reply is a typed failure there.

What it reports is for the kernel's author and for the checks that can only run here:
the CPU compute guard and the record of fused GEMMs / finishing steps (eval/guard.py,
primitives/trace.py), the GPU profiler's launches, CUDA-event times of timed calls,
outputs that alias an input or an earlier call's output, and the kernel's exceptions.

Operations (one JSON frame each, answered by one frame; progress frames may come first):
  load      import the kernel             put       attach a set of inputs (shared tensors)
  prepare   prepare(consts) for a set     call      one checked call (poison, guard, trace)
  profile   one warm + one profiled call  time      one timed call (events); outputs kept
  collect   copy the kept outputs out     drop      forget a set
  ping      an answer, nothing done       exit
  describe  the kernel's calls on shapes alone (primitives/program.py): a program

A launcher (load's "launcher": no kernel file is imported) is the same process serving
descriptions instead: `put` brings each set's program, prepare / call / profile / time run
it with the primitives' own code, and the launch record is its own (eval/remote.py
DescribedKernel).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import traceback
from contextlib import nullcontext
from pathlib import Path
from types import MappingProxyType


def _shut_in(parent: int, cpu_bytes: int | None, cuda: str | None, sock: int) -> str:
    """Before any kernel exists (and, started as a program, before torch's threads): limits,
    the parent-death signal, the sandbox (eval/isolation.py). Only in a runner process: this
    module as the entry point, or a spare the judge forked (`become_runner`)."""
    from epiforge.eval.isolation import own_pid_namespace, sandbox, setup_child

    setup_child(parent, death_signal=signal.SIGKILL, cpu_bytes=cpu_bytes)
    if os.environ.get("EPIFORGE_RUNNER_SANDBOX") == "0":
        return "off (EPIFORGE_RUNNER_SANDBOX=0)"
    if cuda is None:
        got = sandbox(Path.cwd())
    else:
        from epiforge import ROOT as repo

        trees = [str(repo), str(Path.cwd().parent), *sys.path,
                 *os.environ.get("EPIFORGE_SHARED_CACHES", "").split(os.pathsep)]
        if cuda == "system":  # also the system's own trees (not yet seen on a GPU)
            trees += list(SYSTEM_TREES)
        got = sandbox(Path.cwd(), whole_fs=False, readonly=trees)
    # before CUDA exists in this process: the fork leaves no driver state behind
    if got.startswith("user and mount") and own_pid_namespace(signal.SIGKILL, close_in_parent=sock):
        got += ", its own PID namespace"
    return got


def _settings_from_argv() -> tuple[int, int | None, str | None, int]:
    args = sys.argv[1:]
    cpu = args[args.index("--cpu-bytes") + 1] if "--cpu-bytes" in args else None
    cuda = args[args.index("--cuda") + 1] if "--cuda" in args else None
    return int(args[args.index("--parent") + 1]), int(cpu) if cpu else None, cuda, int(args[args.index("--sock") + 1])


#: trees a root runner must not write (e.g. /etc/ld.so.preload reaches every later process,
#: /tmp holds other evaluations' dirs); /dev, /proc, /sys and /run stay as they are for the
#: CUDA driver, the runner's own dir (and TMPDIR in it) writable
SYSTEM_TREES = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/root", "/home",
                "/var", "/boot", "/srv", "/mnt", "/media", "/tmp")


SANDBOX = _shut_in(*_settings_from_argv()) if __name__ == "__main__" else "not a runner process"

import torch  # noqa: E402  (after the sandbox, on purpose)

from epiforge.eval import channel  # noqa: E402
from epiforge.eval.guard import ComputeGuard, TamperCheck, poisoned_allocations  # noqa: E402
from epiforge.eval.kernel import load_kernel_module  # noqa: E402
from epiforge.eval.timing import timed_call  # noqa: E402  (before any kernel: it binds the CUDA event API and its GEMM)
from epiforge.primitives import trace  # noqa: E402

#: how long a runner may keep recently returned outputs alive (so a reuse of their storage shows)
HELD_CALLS = 2


class Failure(Exception):
    """The kernel failed in a way the runner can name: outcome and one line."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome, self.message = outcome, message


def is_compile_error(e: BaseException) -> bool:
    from epiforge.primitives.epilogue import EpilogueError

    if isinstance(e, EpilogueError):
        return True
    lowering = sys.modules.get("epiforge.primitives.lowering")
    if lowering is not None and isinstance(e, lowering.CompileError):
        return True
    mod = type(e).__module__ or ""
    return mod.startswith(("cutlass", "quack")) and "Runtime" not in type(e).__name__


def describe_exception(e: BaseException) -> tuple[str, str]:
    """Outcome and one line for an exception raised by the kernel's code."""
    first = f"{type(e).__name__}: {e}".splitlines()[0][:500]
    if is_compile_error(e):
        return "COMPILE_ERROR", first
    if isinstance(e, torch.OutOfMemoryError):
        return "RUNTIME_ERROR", f"device out of memory: {first}"
    if isinstance(e, MemoryError) or "can't allocate memory" in str(e) or "not enough memory" in str(e):
        return "RUNTIME_ERROR", f"out of memory (the runner's memory limit): {first}"
    if "illegal memory access" in str(e) or "CUDA error" in str(e):
        return "RUNTIME_ERROR", f"CUDA error (the runner's CUDA context is lost): {first}"
    return "RUNTIME_ERROR", first


def _tensors(values) -> dict[str, torch.Tensor]:
    """Every tensor among a dict's values, tuples opened at any depth (prepare() may nest
    them: _freeze), named as a reader would write them: "freq", "pair[1]", "t[0][2]"."""
    out, todo = {}, [(str(k), v) for k, v in reversed(list(values.items()))]
    while todo:
        name, v = todo.pop()
        while name in out:  # a key that reads like a tuple's element ("t[0]" beside a tuple "t"): both kept
            name += "'"
        if isinstance(v, torch.Tensor):
            out[name] = v
        elif isinstance(v, tuple):
            todo.extend((f"{name}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _freeze(prepared) -> MappingProxyType:
    """prepare()'s result, read-only: tensors and plain values only (a list or dict inside
    it would be state run() could keep between calls)."""
    if not isinstance(prepared, dict):
        raise Failure("RUNTIME_ERROR", f"prepare() returned {type(prepared).__name__}, not a dict")

    def plain(v) -> bool:
        if isinstance(v, tuple):
            return all(plain(x) for x in v)
        return v is None or isinstance(v, (torch.Tensor, bool, int, float, str))

    for k, v in prepared.items():
        if not isinstance(k, str) or not plain(v):
            raise Failure("RUNTIME_ERROR", f"prepare() returned {k!r}: {type(v).__name__}; only tensors, numbers, "
                                           "strings and tuples of them are allowed (no state between calls)")
    return MappingProxyType(dict(prepared))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Runner:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.module = None
        self.device = "cpu"
        self.kernel_file = ""
        self.tamper: TamperCheck | None = None
        self.sets: dict[str, dict] = {}
        self.held: list[dict[int, str]] = []  # storages of recent calls' outputs (kept alive in held_outputs)
        self.held_outputs: list[dict] = []
        self.kept = None  # the last timed call's outputs
        self.kept_storages: dict[int, str] = {}
        self.compiled_seen = 0
        self.stage = "load"
        self.sandbox = "not a runner process"
        self.launcher = False  # a launcher runs descriptions, never a kernel file (load's "launcher")
        self.steps_run: list[str] = []

    # ---- the loop ----------------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            try:
                msg, fds = channel.receive(self.sock)
            except (channel.ChannelClosed, channel.ChannelError):
                return
            op = msg.get("op")
            if op == "exit":
                return
            handler = getattr(self, f"op_{op}", None)
            try:
                if handler is None:
                    raise ValueError(f"unknown op {op!r}")
                reply = handler(msg, fds) or {}
            except Failure as f:
                reply = {"error": {"outcome": f.outcome, "message": f.message}}
            except Exception as e:  # the kernel raised, or it broke this process's machinery
                traceback.print_exc()
                outcome, line = describe_exception(e)
                reply = {"error": {"outcome": outcome, "message": line}}
            finally:
                for fd in fds:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            reply["compiled"] = self._new_compiles()
            channel.send(self.sock, {"reply": op, **reply})

    def progress(self, stage: str) -> None:
        channel.send(self.sock, {"progress": stage})

    def _new_compiles(self) -> list[dict]:
        lowering = sys.modules.get("epiforge.primitives.lowering")
        if lowering is None:
            return []
        log = lowering.COMPILE_LOG[self.compiled_seen:]
        self.compiled_seen = len(lowering.COMPILE_LOG)
        return list(log)

    # ---- operations --------------------------------------------------------------------------

    def op_ping(self, msg, fds):
        return {"pong": True, "sandbox": self.sandbox}

    def op_load(self, msg, fds):
        self.device = msg["device"]
        self.kernel_file = str(Path(msg["path"]).resolve()) if msg.get("path") else ""
        if self.device == "cuda":
            try:
                torch.cuda.init()
            except Exception as e:  # the sandbox kept the driver from starting: the judge retries with less
                traceback.print_exc()
                return {"cuda": False, "why": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
            if msg.get("gpu_memory_gib"):
                total = torch.cuda.get_device_properties(0).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, msg["gpu_memory_gib"] * 2**30 / total))
            from epiforge.primitives.lowering import _import_quack

            _import_quack()  # before the tamper snapshot: quack's import is not the kernel's doing
            _profile(lambda: None)  # the profiler's lazy set-up, likewise
        trace.set_compile_listener(lambda building: self.progress("compile" if building else self.stage))
        if msg.get("finishing"):
            _register_finishing(Path(msg["finishing"]))
        if msg.get("launcher"):  # runs descriptions (put's "program"): no kernel file, no kernel code
            self.launcher = True
            return {"ok": True, "syscalls": "not needed: no kernel code runs in a launcher"}
        from epiforge.eval.isolation import forbid_unix_sockets

        # last before the kernel's code: the driver, quack and the profiler have set up
        syscalls = "off (EPIFORGE_RUNNER_SANDBOX=0)" if os.environ.get("EPIFORGE_RUNNER_SANDBOX") == "0" \
            else forbid_unix_sockets()
        self.tamper = TamperCheck()
        try:
            module = load_kernel_module(Path(self.kernel_file))
        except Exception as e:  # the kernel's own import-time code failed
            traceback.print_exc()
            raise Failure("COMPILE_ERROR", f"importing the kernel failed: {type(e).__name__}: {e}".splitlines()[0][:500])
        patched = self.tamper.changed()
        if patched:
            raise Failure("RUNTIME_ERROR", f"importing the kernel patched {patched[:5]}")
        if not callable(getattr(module, "run", None)):
            raise Failure("STATIC_REJECTED", "the kernel defines no run(inputs, prepared, config=None)")
        self.module = module
        return {"ok": True, "syscalls": syscalls}

    def op_put(self, msg, fds):
        refs = [channel.TensorRef(**r) for r in msg["tensors"]]
        values = {r.name: channel.attach(r, fds) for r in refs}
        values.update(msg.get("scalars", {}))
        self.sets[msg["set"]] = {"inputs": values, "prepared": MappingProxyType({}), "prepared_bits": {}}
        if self.launcher:
            from epiforge.primitives import program

            try:
                self.sets[msg["set"]]["exe"] = program.Executable(program.Program.from_json(msg["program"]))
            except (program.ProgramError, KeyError, TypeError) as e:
                raise Failure("RUNTIME_ERROR", f"the kernel's description: {e}"[:500]) from None
        return {"ok": True}

    def op_describe(self, msg, fds):
        """The kernel's prepare() and run() described on the shapes of msg's specs, as on
        msg's device (fake values: none exist here): a program for a launcher
        (primitives/program.py)."""
        from epiforge.primitives import program

        self.stage = "describe"
        try:
            described = program.describe(self.module, msg["specs"], tuple(msg["consts"]), msg.get("device", "cpu"))
        except program.ProgramError as e:
            raise Failure("RUNTIME_ERROR", f"describing the kernel: {e}"[:500]) from None
        self._check_tamper()
        return {"program": described.to_json()}

    def _prepare(self, entry: dict, consts: list[str]):
        if self.launcher:
            entry["table"] = entry["exe"].prepare(entry["inputs"])
            return entry["exe"].prepared(entry["table"])
        return self.module.prepare({k: entry["inputs"][k] for k in consts}) if hasattr(self.module, "prepare") else {}

    def _run(self, entry: dict):
        """One run(): the kernel's own, or (a launcher) its description's, whose steps are
        kept in self.steps_run for the launch check."""
        if self.launcher:
            outputs, self.steps_run = entry["exe"].run(entry["table"])
            return outputs
        return self.module.run(dict(entry["inputs"]), entry["prepared"])

    def op_prepare(self, msg, fds):
        self.stage = "numerics"
        entry = self.sets[msg["set"]]
        prepared = _freeze(self._prepare(entry, msg["consts"]))
        if self.device == "cuda":
            torch.cuda.synchronize()
        self._check_tamper()
        entry["prepared"] = prepared
        entry["prepared_bits"] = {k: _bits(v).clone() for k, v in _tensors(prepared).items()}
        return {"ok": True}

    def op_call(self, msg, fds):
        """One checked call: poisoned allocations, the CPU guard and trace, every run-time check."""
        self.stage = msg.get("stage", "numerics")
        entry = self.sets[msg["set"]]
        guard = ComputeGuard(self.kernel_file) if self.device == "cpu" and not self.launcher else None
        with trace.recording() as launched, poisoned_allocations(), (guard if guard is not None else nullcontext()):
            outputs = self._run(entry)
            if self.device == "cuda":
                torch.cuda.synchronize()
        self._check_after(entry, outputs)
        reply = self._deliver(outputs, msg["outputs"], fds)
        violations = list(guard.violations) if guard else []
        if self.launcher:  # the description's own torch work, by step: the CPU's launch check
            from epiforge.primitives.program import own_compute

            violations = [f"run() itself applies {op} (not a view)" for op in own_compute(self.steps_run)]
        reply.update(launched=list(launched), violations=violations)
        self._hold(outputs)
        return reply

    def op_profile(self, msg, fds):
        """The launches of one run() (after a warm one), on the timed stream (a marker kernel names it)."""
        self.stage = "launches"
        entry = self.sets[msg["set"]]
        self._run(entry)
        if self.device == "cpu":  # no profiler: the primitives' own record (primitives/trace.py)
            with trace.recording() as launched:
                self._run(entry)
            self._check_tamper()
            return {"launches": [[name, None] for name in launched], "stream": None, "recorded": True}
        torch.cuda.synchronize()
        launches, stream = _profile(lambda: self._run(entry))
        self._check_tamper()
        return {"launches": [[name, s] for name, s in launches], "stream": stream}

    def op_time(self, msg, fds):
        """One timed call: L2 flushed and a GPU spin queued first (eval.timing), CUDA events
        around run(), then a synchronize. The outputs are kept for `collect`; they must not
        reuse the storage of the previous timed call's outputs, which are still alive."""
        self.stage = "benchmark"
        clock = "cuda" if self.device == "cuda" else "wall"
        if msg.get("null"):  # the procedure alone, for the judge's wall-clock check
            return {"us": timed_call(lambda: None, flush=msg.get("flush", True), clock=clock)}
        entry = self.sets[msg["set"]]
        previous, previous_storages = self.kept, self.kept_storages
        box = {}

        def call():
            box["out"] = self._run(entry)

        us = timed_call(call, flush=msg.get("flush", True), clock=clock)
        outputs = box["out"]
        storages = {_storage(t): k for k, t in _tensors(outputs).items() if t.numel()} if isinstance(outputs, dict) else {}
        reused = sorted(k for p, k in storages.items() if p in previous_storages)
        self.kept, self.kept_storages = outputs, storages
        del previous
        if reused:
            raise Failure("RUNTIME_ERROR", f"a timed call returned {reused} in the storage of the previous call's "
                                           "outputs (every call must write fresh buffers)")
        return {"us": us}

    def op_collect(self, msg, fds):
        if self.kept is None:
            raise Failure("RUNTIME_ERROR", "nothing to collect: no timed call returned outputs")
        return self._deliver(self.kept, msg["outputs"], fds)

    def op_drop(self, msg, fds):
        if msg["set"] == "*":
            self.sets.clear()
        self.sets.pop(msg["set"], None)
        self.kept, self.kept_storages = None, {}  # held outputs stay: a reuse across sets shows too
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        return {"ok": True}

    # ---- checks ------------------------------------------------------------------------------

    def _check_tamper(self) -> None:
        patched = self.tamper.changed() if self.tamper is not None else []
        if patched:
            raise Failure("RUNTIME_ERROR", f"the kernel patched {patched[:5]}")

    def _check_after(self, entry: dict, outputs) -> None:
        self._check_tamper()
        now = _tensors(entry["prepared"])
        bad = [k for k, before in entry["prepared_bits"].items()
               if k not in now or not torch.equal(_bits(now[k]), before)]
        if bad:
            raise Failure("RUNTIME_ERROR", f"run() modified prepared {bad} (state between calls)")
        if not isinstance(outputs, dict):
            return  # the judge names it (INCORRECT_SHAPE)
        theirs = {**{_storage(t): k for k, t in _tensors(entry["inputs"]).items() if t.numel()},
                  **{_storage(t): k for k, t in _tensors(entry["prepared"]).items() if t.numel()}}
        for name, t in _tensors(outputs).items():
            if t.numel() == 0:
                continue
            ptr = _storage(t)
            if ptr in theirs:
                raise Failure("RUNTIME_ERROR", f"output {name!r} aliases {theirs[ptr]!r} (outputs must be new tensors)")
            for held in self.held:
                if ptr in held:
                    raise Failure("RUNTIME_ERROR", f"output {name!r} reuses the storage of {held[ptr]} returned by an "
                                                   "earlier call (outputs must be new tensors)")

    def _hold(self, outputs) -> None:
        if not isinstance(outputs, dict):
            return
        self.held.append({_storage(t): f"an earlier call's {k!r}" for k, t in _tensors(outputs).items() if t.numel()})
        self.held_outputs.append(outputs)
        self.held, self.held_outputs = self.held[-HELD_CALLS:], self.held_outputs[-HELD_CALLS:]

    def _deliver(self, outputs, buffers: list[dict], fds: list[int]) -> dict:
        """Copy each returned output that fits its buffer (name, shape, dtype, device) into
        the judge's buffer; describe every one, fitting or not."""
        if not isinstance(outputs, dict):
            return {"returned": type(outputs).__name__, "outputs": {}, "extra": []}
        described = {}
        for raw in buffers:
            ref = channel.TensorRef(**raw)
            value = outputs.get(ref.name)
            if type(value) is not torch.Tensor:  # a subclass could answer shape or layout questions falsely
                described[ref.name] = {"kind": "missing" if value is None else type(value).__name__[:100]}
                continue
            info = {"kind": "tensor", "shape": list(value.shape), "dtype": channel.DTYPE_NAMES.get(value.dtype, str(value.dtype)),
                    "device": value.device.type, "stride": list(value.stride()), "contiguous": value.is_contiguous(),
                    "copied": False}
            fits = (tuple(value.shape) == tuple(ref.shape) and info["dtype"] == ref.dtype
                    and value.device.type == ref.device)
            if fits:
                channel.attach(ref, fds).copy_(value)
                info["copied"] = True
            described[ref.name] = info
        if self.device == "cuda":
            torch.cuda.synchronize()
        wanted = {b["name"] for b in buffers}
        extra = sorted(str(k) for k in outputs if k not in wanted)[:20]
        return {"returned": "dict", "outputs": described, "extra": extra}


def _register_finishing(file: Path) -> None:
    """The task's finishing.py, run by path so that its steps are registered before the kernel
    loads. Not through `tasks`: the runner must never hold the task's spec, reference or
    tolerance (finishing.py imports primitives and torch only, tasks/AUTHORING.md)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("epiforge_task_finishing", str(file))
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the task's own code: the judge loaded it already, so this is unexpected
        traceback.print_exc()
        raise Failure("RUNTIME_ERROR", f"the task's finishing.py failed in the runner: {type(e).__name__}: {e}"[:500])


def _profile(fn) -> tuple[list[tuple[str, int | None]], int | None]:
    """(kernels fn launched in order with their stream ids, stream id of the marker kernel)."""
    from torch.profiler import ProfilerActivity, profile

    marker = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        marker.add_(1.0)  # on the current (timed) stream: names it
        torch.cuda.synchronize()
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.name
               and "Memcpy" not in e.name and "Memset" not in e.name]
    kernels.sort(key=lambda e: e.time_range.start)
    if not kernels:
        return [], None
    stream = getattr(kernels[0], "device_resource_id", None)
    return [(e.name, getattr(e, "device_resource_id", None)) for e in kernels[1:]], stream


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sock", type=int, required=True)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--cpu-bytes", type=int, default=None)
    ap.add_argument("--cuda", choices=["system", "trees"], default=None,
                    help="the kernel runs on the GPU: the sandbox keeps the driver working (system: the repo, Python "
                         "paths, caches and the system's trees read-only; trees: without the system's trees)")
    args = ap.parse_args(argv)
    os.set_inheritable(args.sock, False)
    runner = Runner(socket.socket(fileno=args.sock))
    runner.sandbox = SANDBOX
    runner.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing of the kernel's (atexit, threads, CUDA teardown) runs after the last reply


def become_runner(sock: socket.socket, parent: int) -> None:
    """A spare runner's life (`fork_spares`): forked by the judge with this module's imports
    (torch's included) and before the judge read anything of an evaluation, it waits for
    the judge to name its dir, environment, stderr file and memory limit, then goes on as
    `python -m epiforge.eval.runner` would, without paying for the imports again. It never
    returns; a judge that closes the socket instead ends it."""
    try:
        order, fds = channel.receive(sock)
    except (channel.ChannelClosed, channel.ChannelError, OSError):
        os._exit(0)
    for fd in fds:
        os.close(fd)
    if order.get("op") != "become":
        os._exit(0)
    err = os.open(order["stderr"], os.O_WRONLY | os.O_APPEND)
    os.dup2(err, 1)
    os.dup2(err, 2)
    os.close(err)
    os.chdir(order["cwd"])
    os.environ.clear()
    os.environ.update(order["env"])
    sys.path[0] = os.getcwd()  # as `python -m` puts its cwd first
    sys.argv = [__file__, "--sock", str(sock.fileno()), "--parent", str(parent)]
    global SANDBOX
    SANDBOX = _shut_in(parent, order.get("cpu_bytes"), None, sock.fileno())
    runner = Runner(sock)
    runner.sandbox = SANDBOX
    runner.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


#: the spare runners this process (a judge) forked: (pid, its end of the channel), not yet
#: handed a candidate (eval/remote.py KernelProcess takes them)
SPARES: list[tuple[int, socket.socket]] = []


#: how many spares a judge forks: a candidate judged in the launcher mode takes two (the
#: describer and the launcher)
SPARES_PER_JUDGE = 2


#: torch modules that quack's epilogue library imports (quack.epilogue.quantize_out ->
#: torch._inductor.compile_fx, torch._dynamo) in every runner that describes or launches a
#: library epilogue: ~2 s of a CPU runner's ~3 s of imports (lab/results/cpu/test-suite.md),
#: paid instead once by a warm zygote (eval/judge_zygote.py) for all its judges' spares (not
#: by each judge: measured slower there, lab/results/cpu/test-suite.md). Only torch's: quack
#: and the CuTe DSL read the runner's own caches and compile target (remote.LATE_ENV) when
#: they import.
RUNNER_IMPORTS = ("torch._dynamo", "torch._inductor.compile_fx")


def warm_imports() -> bool:
    """Import RUNNER_IMPORTS for the spares to inherit, then forget the temp dir their import
    looked up (tempfile caches it), so that each runner finds its own TMPDIR. Their module
    constants made from it (inductor's compile caches, which no kernel may use: static_checks
    forbids torch.compile) keep the zygote's. Not on a machine with an NVIDIA GPU: there the
    import initialises CUDA, and no process forked after it could use CUDA again. Returns
    whether it imported."""
    import importlib
    import tempfile
    from pathlib import Path

    if any(Path("/dev").glob("nvidia[0-9]*")):
        return False
    for name in RUNNER_IMPORTS:
        importlib.import_module(name)
    tempfile.tempdir = None
    return True


def fork_spares(n: int = SPARES_PER_JUDGE) -> None:
    """Fork `n` spare CPU runners (`become_runner`) from the judge at its very start, with
    this module's imports (torch's included; RUNNER_IMPORTS too where a warm zygote forked the
    judge) and nothing of the judge's own: no task, no reference, no request (it has not been
    read). A spare saves a runner's start-up (Python's and torch's import;
    lab/results/cpu/runner-spares.json). In it the judge's
    pipes are closed and stdin is /dev/null; it is a session of its own, dumpable as a new
    process is, and dies with the judge."""
    from epiforge.eval.isolation import make_dumpable, setup_child

    sys.stdout.flush()
    sys.stderr.flush()
    for _ in range(n):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            try:
                parent = os.getppid()
                os.setsid()
                make_dumpable()
                for sock in [ours, *(s for _, s in SPARES)]:  # the judge's ends: closed below, never twice
                    sock.detach()
                SPARES.clear()
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                keep = theirs.fileno()
                os.closerange(3, keep)
                os.closerange(keep + 1, 1 << 16)
                setup_child(parent, death_signal=signal.SIGKILL)
                become_runner(theirs, parent)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(1)
        theirs.close()
        SPARES.append((pid, ours))


if __name__ == "__main__":
    sys.exit(main())
