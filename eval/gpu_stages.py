"""The timed stages of one shape, in the judge, after its numerics passed: on a GPU
(tests marked `gpu`, on the H200). The same code also runs on a CPU, for the evaluator's
own tests only: there the launch check reads the primitives' record (primitives/trace.py)
instead of the profiler and every clock is the host's; evaluate() never times on a CPU.

launches      one warm run() then one profiled run() in the runner: every kernel it
              launched is judged by eval/launches.py, streams included (a marker kernel
              names the timed stream). One more profiled call is slipped in at a point of
              the timed phase drawn from the secret seed.
benchmark     repetitions in a fresh seeded random order: the kernel (timed in its runner
              with CUDA events, eval.timing.timed_call) and the baselines (timed here the
              same way: cuBLAS torch.mm of the task's GEMM shape and layouts, "GEMM-only",
              and the eager unfused PyTorch). Every repetition gets new values of every
              non-constant input (the weights rotate over a few sets, each with its own
              prepare()), so no output a kernel made before is right again. After every
              timed kernel call its outputs are copied into the judge's buffers; whether
              they are checked against that repetition's references is drawn from the secret
              seed after the call ran (CHECKED_REPS on average), so a kernel that is cheap or
              different on any timed call risks INCORRECT_NUMERICS on each, and one that
              reuses its last outputs' storage fails in the runner. The judge also times each
              repetition of the runner on its own wall clock: the kernel's claimed time must
              account for it (`wall_check`).
recheck       one more checked trial on new inputs (eval/numerics.py).
plausibility  the kernel's median against the roofline floor (eval/plausibility.py), and
              the wall-clock check.
"""

from __future__ import annotations

import random
import statistics
import time

import torch

from eval.launches import Launch, classify, classify_recorded
from eval.numerics import (
    InputSet,
    OutputBuffers,
    derive_seed,
    judge_delivery,
    make_input_set,
    references,
    run_trial,
)
from eval.plausibility import Ceilings, check as plausible
from eval.remote import Delivered, KernelFailure, KernelProcess, Profiled, Timed
from eval.result import Outcome, ShapeTiming
from eval.timing import summarize, timed_call

#: input sets (their own weights, each with its own prepare()) the timed calls rotate through
ROTATE = {"smoke": 4, "paper": 2}
#: how many timed calls of a shape are checked against references, on average (drawn from
#: the secret seed after each call ran; every call's outputs are collected alike)
CHECKED_REPS = 6
#: the kernel's claimed time may leave unexplained at most this much of the judge's wall
#: clock per repetition, beyond what the runner's procedure alone leaves (null calls)
WALL_SLACK_FRACTION = 0.2
WALL_SLACK_US = 1000.0
#: the most the runner's own procedure may leave beyond the judge's (IPC, Python)
RUNNER_OVERHEAD_CAP_US = 1500.0


class StageFailure(Exception):
    def __init__(self, outcome: Outcome, message: str):
        super().__init__(message)
        self.outcome, self.message = outcome, message


def _put(task, kp: KernelProcess, name: str, dims, seed: int, stage: str, device: str) -> InputSet:
    iset = make_input_set(name, task, task.make_inputs(dims, seed, device), device)
    iset.put(kp, stage)
    consts = [t.name for t in task.inputs if t.constant]
    kp.ask({"op": "prepare", "set": name, "consts": consts}, stage=stage)
    return iset


def check_launches(task, kp: KernelProcess, set_name: str, stage: str) -> tuple[bool, str, list[str]]:
    frame = kp.ask({"op": "profile", "set": set_name}, stage=stage)
    prof = kp.parse(Profiled, frame, stage)
    if prof.recorded:
        ok, line = classify_recorded([name for name, _ in prof.launches], task.launches)
        return ok, line, [name for name, _ in prof.launches]
    launches = [Launch(name, s) for name, s in prof.launches]
    verdict = classify(launches, task.launches, prof.stream)
    return verdict.ok, verdict.message, [x.name for x in launches]


def benchmark(task, kp: KernelProcess, shape, master_seed: int, shape_index: int, *, reps: int, warmup: int,
              rotate: int, device: str = "cuda") -> dict:
    """Timings of the kernel and the baselines, the timed outputs checked (module docstring)."""
    dims = shape.dims()
    sets = [_put(task, kp, f"b{shape_index}r{j}", dims, derive_seed(master_seed, shape_index, 100 + j), "benchmark",
                 device) for j in range(rotate)]
    bufs = OutputBuffers.for_task(task, dims, device)
    clock = "cuda" if device == "cuda" else "wall"
    order = random.Random(derive_seed(master_seed, shape_index, 300))  # the order, the profiled call's place
    draws = random.Random(derive_seed(master_seed, shape_index, 301))  # which calls are checked, drawn after they ran
    profile_at = order.randrange(reps)
    p_check = min(1.0, CHECKED_REPS / reps)
    variable = [t.name for t in task.inputs if not t.constant]
    checked = []

    def refresh(i: int, j: int) -> None:
        """New values of every non-constant input of set j for repetition i, for the kernel
        (the shared copy) and the baselines (the judge's): nothing a kernel saw before."""
        fresh = task.make_inputs(dims, derive_seed(master_seed, shape_index, 1000 + i), device)
        for name in variable:
            sets[j].private[name].copy_(fresh[name])
            sets[j].shared[name].copy_(fresh[name])
        del fresh
        if device == "cuda":
            torch.cuda.synchronize()

    def kernel_rep(i: int, j: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        frame = kp.ask({"op": "time", "set": sets[j].name}, stage="benchmark")
        wall = (time.perf_counter() - t0) * 1e6
        us = kp.parse(Timed, frame, "benchmark").us
        delivered = _collect(kp, bufs)
        if draws.random() < p_check or (i == reps - 1 and not checked):
            checked.append(i)
            exact, lowprec = references(task, sets[j].private, dims)
            trial = judge_delivery(task, delivered, dims, bufs, exact, lowprec)
            del exact, lowprec
            if trial.outcome != Outcome.PASSED:
                raise StageFailure(trial.outcome, f"the outputs of timed call {i + 1} are wrong (it behaves differently "
                                                  f"while timed): {trial.message}")
        elif delivered.returned != "dict" or not all(o.copied for o in delivered.outputs.values()) \
                or len(delivered.outputs) != len(task.outputs):
            raise StageFailure(Outcome.INCORRECT_SHAPE, f"timed call {i + 1} returned outputs that do not fit the task")
        return us, wall

    ab = [task.gemm_operands(s.private) for s in sets]
    local = {
        "gemm_only": lambda j: torch.mm(ab[j][0], ab[j][1].T),
        "eager": lambda j: task.unfused(sets[j].private, dims),
    }

    def local_rep(name: str, j: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        us = timed_call(lambda: local[name](j), clock=clock)
        return us, (time.perf_counter() - t0) * 1e6

    names = ["kernel", *local]
    for i in range(warmup):
        kp.ask({"op": "time", "set": sets[i % rotate].name}, stage="benchmark")
        for name in local:
            local_rep(name, i % rotate)
    rtt = _round_trip_us(kp)
    null = []
    for _ in range(7):
        t0 = time.perf_counter()
        us = kp.parse(Timed, kp.ask({"op": "time", "null": True}, stage="benchmark"), "benchmark").us
        null.append((time.perf_counter() - t0) * 1e6 - us)
    samples = {n: [] for n in names}
    walls = {n: [] for n in names}
    for i in range(reps):
        j = i % rotate
        refresh(i, j)
        if i == profile_at:
            ok, line, _ = check_launches(task, kp, sets[j].name, "benchmark")
            if not ok:
                raise StageFailure(Outcome.EXTRA_LAUNCHES, f"a call during the timed phase: {line}")
        for name in order.sample(names, len(names)):
            us, wall = kernel_rep(i, j) if name == "kernel" else local_rep(name, j)
            samples[name].append(us)
            walls[name].append(wall)
    bufs.close()
    return ShapeTiming.measured({n: summarize(samples[n], keep=True) for n in names},
                                wall_check=wall_check(samples, walls, rtt, statistics.median(null)),
                                checked_calls=len(checked),
                                notes={"gemm_only": "cuBLAS torch.mm of the task's GEMM (shape and layouts)",
                                       "eager": "the task's unfused PyTorch, eager"})


def _collect(kp: KernelProcess, bufs: OutputBuffers) -> Delivered:
    """The last timed call's outputs, copied into the judge's (freshly poisoned) buffers."""
    bufs.poison()
    refs, fds = bufs.wire()
    return kp.parse(Delivered, kp.ask({"op": "collect", "outputs": refs}, fds, stage="benchmark"), "benchmark")


def _round_trip_us(kp: KernelProcess, n: int = 9) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        kp.ask({"op": "ping"}, stage="benchmark")
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def wall_check(samples: dict[str, list[float]], walls: dict[str, list[float]], rtt_us: float,
               runner_null_gap_us: float | None = None) -> dict:
    """Does the kernel's claimed time account for the judge's wall clock? wall - claimed
    for the kernel's repetitions may exceed what the runner's procedure alone leaves (its
    null calls: flush, spin, sync, IPC and Python, timed by the judge too) by at most a
    slack. A runner that claims less than the GPU worked leaves more. The null calls' own
    overhead is believed only up to the judge's own (its timed calls of the baselines)
    plus a round trip and RUNNER_OVERHEAD_CAP_US, so a runner cannot buy slack by being
    slow on purpose."""
    kernel_gap = statistics.median(w - s for w, s in zip(walls["kernel"], samples["kernel"]))
    local = [n for n in samples if n != "kernel"]
    own_gap = statistics.median(w - s for n in local for w, s in zip(walls[n], samples[n]))
    cap = own_gap + rtt_us + RUNNER_OVERHEAD_CAP_US
    base = cap if runner_null_gap_us is None else min(runner_null_gap_us, cap)
    claimed = statistics.median(samples["kernel"])
    allowed = base + max(WALL_SLACK_US, WALL_SLACK_FRACTION * claimed)
    return {"kernel_gap_us": round(kernel_gap, 1), "judge_gap_us": round(own_gap, 1), "round_trip_us": round(rtt_us, 1),
            "runner_null_gap_us": None if runner_null_gap_us is None else round(runner_null_gap_us, 1),
            "allowed_gap_us": round(allowed, 1), "ok": kernel_gap <= allowed}


def run_gpu_stages(task, kp: KernelProcess, shape, shape_result, master_seed: int, shape_index: int, *, stage,
                   ceilings: Ceilings, reps: int = 50, warmup: int = 5, shapes_name: str = "smoke",
                   device: str = "cuda", timed: bool = True) -> None:
    """Fill shape_result (launches, timing, outcome) in place. `stage(name)` reports progress.
    timed=False: the launch check only."""
    dims = shape.dims()
    try:
        stage("launches")
        name = f"l{shape_index}"
        _put(task, kp, name, dims, derive_seed(master_seed, shape_index, 50), "launches", device)
        ok, launch_line, names = check_launches(task, kp, name, "launches")
        kp.ask({"op": "drop", "set": name}, stage="launches")
        shape_result.launches = names
        if not ok:
            shape_result.outcome, shape_result.message = Outcome.EXTRA_LAUNCHES, launch_line
            return
        if not timed:
            shape_result.message = f"{launch_line}; not timed (asked for numerics and launches only)"
            return
        stage("benchmark")
        summary = benchmark(task, kp, shape, master_seed, shape_index, reps=reps, warmup=warmup,
                            rotate=ROTATE.get(shapes_name, 2), device=device)
        kp.ask({"op": "drop", "set": "*"}, stage="benchmark")
        if device == "cuda":
            torch.cuda.empty_cache()
        stage("recheck")
        trial = run_trial(task, kp, dims, derive_seed(master_seed, shape_index, 200), device, "kernel_first",
                          f"r{shape_index}")
    except KernelFailure as f:
        shape_result.outcome, shape_result.message = Outcome(f.outcome), f.message
        return
    except StageFailure as f:
        shape_result.outcome, shape_result.message = f.outcome, f.message
        return
    if trial.outcome != Outcome.PASSED:
        shape_result.outcome, shape_result.message = trial.outcome, f"after timing, on new inputs: {trial.message}"
        return
    stage("plausibility")
    good, line, floor = plausible(summary.kernel.median_us, task.flops(dims), task.min_bytes(dims), ceilings)
    base_ok, _, _ = plausible(summary.baselines["gemm_only"].median_us, task.flops(dims), task.min_bytes(dims),
                              ceilings)
    summary.roofline = {"floor_us": floor, "peak_tflops": ceilings.peak_tflops,
                        "bandwidth_tbs": ceilings.bandwidth_tbs, "baseline_below_floor": not base_ok}
    shape_result.timing = summary
    wall = summary.wall_check
    if not good:
        shape_result.outcome, shape_result.message = Outcome.IMPLAUSIBLE, line
        return
    if not wall["ok"]:
        shape_result.outcome = Outcome.IMPLAUSIBLE
        shape_result.message = (f"the kernel's claimed times do not account for the judge's wall clock: "
                                f"{wall['kernel_gap_us']:.0f} us per call unexplained, at most "
                                f"{wall['allowed_gap_us']:.0f} us expected")
        return
    shape_result.message = (f"{summary.fused_over_gemm_only.median:.3f}x GEMM-only; {launch_line}; {line}" +
                            ("; note: cuBLAS ran below the floor, the ceilings look low" if not base_ok else ""))

