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
              same way: the plain GEMMs that may be the speed of light, cuBLAS and quack's
              identity-epilogue GEMM at the kernel's config and the shape's fastest known
              configs (eval/baselines.py), the fastest of which is "GEMM-only"; and the eager
              unfused PyTorch). Every repetition gets new values of every
              non-constant input (the weights rotate over a few sets, each with its own
              prepare()), so no output a kernel made before is right again. After every
              timed kernel call its outputs are copied into the judge's buffers; whether
              they are checked against that repetition's references is drawn from the secret
              seed after the call ran (CHECKED_REPS on average), so a kernel that is cheap or
              different on any timed call risks INCORRECT_NUMERICS on each, and one that
              reuses its last outputs' storage fails in the runner. The judge also times each
              repetition of the runner on its own wall clock: the kernel's claimed time must
              account for it (`wall_check`). The GPU's clocks are sampled through the
              timed repetitions (eval/clocks.py): every Timing of the shape carries them.
recheck       one more checked trial on new inputs (eval/numerics.py).
plausibility  the kernel's median against the roofline floor (eval/plausibility.py), and
              the wall-clock check.
"""

from __future__ import annotations

import random
import statistics
import time

import torch

from epiforge.eval.baselines import close_baselines, extra_baselines, gemm_candidates
from epiforge.eval.clocks import ClockSampler
from epiforge.eval.launches import Launch, classify, classify_recorded
from epiforge.eval.numerics import (
    InputSet,
    OutputBuffers,
    derive_seed,
    judge_delivery,
    make_input_set,
    references,
    run_trial,
)
from epiforge.eval.plausibility import Ceilings, check as plausible
from epiforge.eval.remote import Delivered, KernelFailure, KernelProcess, Profiled, Timed
from epiforge.eval.result import Outcome, ShapeTiming
from epiforge.eval.stats import fastest
from epiforge.eval.timing import gpu_clocks, summarize, timed_call

#: input sets (their own weights, each with its own prepare()) the timed calls rotate through
ROTATE = {"smoke": 4, "paper": 2}
#: how many timed calls of a shape are checked against references, on average (drawn from
#: the secret seed after each call ran; every call's outputs are collected alike)
CHECKED_REPS = 6
#: the kernel's claimed time may leave unexplained at most this much of the judge's wall
#: clock per repetition, beyond what the runner's procedure alone leaves (null calls)
WALL_SLACK_FRACTION = 0.2
WALL_SLACK_US = 1000.0
#: on a CPU the claimed time is the runner's own wall clock around an emulated call, so the
#: check only guards the mechanism, and Python's allocation noise on a loaded 2-core machine
#: (CI) is larger than a GPU's: a wider slack there, never used for a GPU verdict
CPU_WALL_SLACK_FRACTION = 0.5
CPU_WALL_SLACK_US = 5000.0
#: the most the runner's own procedure may leave beyond the judge's (IPC, Python)
RUNNER_OVERHEAD_CAP_US = 1500.0


class StageFailure(Exception):
    def __init__(self, outcome: Outcome, message: str):
        super().__init__(message)
        self.outcome, self.message = outcome, message


def _put(task, kp: KernelProcess, name: str, inputs: dict, stage: str, device: str) -> InputSet:
    """inputs: the judge's private copy (several kernels' sets may share it); the runner gets a
    shared copy of its own, and prepares from it."""
    iset = make_input_set(name, task, inputs, device)
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


class KernelStageFailure(StageFailure):
    """StageFailure of one of several kernels timed together."""

    def __init__(self, name: str, outcome: Outcome, message: str):
        super().__init__(outcome, message)
        self.name = name


def benchmark(task, kernels: dict[str, KernelProcess], shape, master_seed: int, shape_index: int, *, reps: int,
              warmup: int, rotate: int, device: str = "cuda", kernel_configs: list[str] = (),
              baselines: list[str] = (), stage=lambda name: None) -> dict[str, ShapeTiming]:
    remotes = {}  # baselines timed in a process of their own (eval/coda.py): ended here, whatever happened
    try:
        return _benchmark(task, kernels, shape, master_seed, shape_index, reps=reps, warmup=warmup, rotate=rotate,
                          device=device, kernel_configs=kernel_configs, baselines=baselines, stage=stage,
                          remotes=remotes)
    finally:
        close_baselines(remotes)


def _benchmark(task, kernels: dict[str, KernelProcess], shape, master_seed: int, shape_index: int, *, reps: int,
               warmup: int, rotate: int, device: str, kernel_configs: list[str], baselines: list[str], stage,
               remotes: dict) -> dict[str, ShapeTiming]:
    """Timings of every kernel and the baselines in ONE interleaved run, the timed outputs
    checked (module docstring). Each kernel's ShapeTiming has the baselines and, under
    "kernel:<name>", every other kernel, so their ratios are per repetition too. A kernel
    that fails raises KernelStageFailure naming it. stage(name): "warmup" while the inputs
    are shared and the baselines built (torch.compile's compile among them) and everything
    is warmed up ("baselines" while the baselines are built: torch.compile's compile, quack's
    GEMM configs), then "benchmark" for the timed repetitions."""
    stage("warmup")
    dims = shape.dims()
    seeds = [derive_seed(master_seed, shape_index, 100 + j) for j in range(rotate)]
    # the judge's private copy of each set, one for every kernel (their values are the same);
    # each kernel's runner reads a shared copy of its own
    private = [task.make_inputs(dims, seeds[j], device) for j in range(rotate)]
    sets = {}
    for name, kp in kernels.items():
        try:
            sets[name] = [_put(task, kp, f"b{shape_index}r{j}", private[j], "benchmark", device)
                          for j in range(rotate)]
        except KernelFailure as f:
            raise KernelStageFailure(name, Outcome(f.outcome), f.message) from None
    bufs = {name: OutputBuffers.for_task(task, dims, device) for name in kernels}
    clock = "cuda" if device == "cuda" else "wall"
    order = random.Random(derive_seed(master_seed, shape_index, 300))  # the order, the profiled call's place
    draws = random.Random(derive_seed(master_seed, shape_index, 301))  # which calls are checked, drawn after they ran
    profile_at = order.randrange(reps)
    p_check = min(1.0, CHECKED_REPS / reps)
    variable = [t.name for t in task.inputs if not t.constant]
    checked = {name: 0 for name in kernels}

    def refresh(i: int, j: int) -> None:
        """New values of every non-constant input of set j for repetition i, for every kernel
        (its shared copy) and the baselines (the judge's): nothing a kernel saw before."""
        fresh = task.make_inputs(dims, derive_seed(master_seed, shape_index, 1000 + i), device)
        for name in variable:
            private[j][name].copy_(fresh[name])
            for kernel_sets in sets.values():
                kernel_sets[j].shared[name].copy_(fresh[name])
        del fresh
        for remote in remotes.values():
            remote.refresh(j)
        if device == "cuda":
            torch.cuda.synchronize()

    def kernel_rep(name: str, i: int, j: int) -> tuple[float, float]:
        kp = kernels[name]
        try:
            t0 = time.perf_counter()
            frame = kp.ask({"op": "time", "set": sets[name][j].name}, stage="benchmark")
            wall = (time.perf_counter() - t0) * 1e6
            us = kp.parse(Timed, frame, "benchmark").us
            delivered = _collect(kp, bufs[name])
        except KernelFailure as f:
            raise KernelStageFailure(name, Outcome(f.outcome), f.message) from None
        if draws.random() < p_check or (i == reps - 1 and not checked[name]):
            checked[name] += 1
            exact, lowprec = references(task, private[j], dims)
            trial = judge_delivery(task, delivered, dims, bufs[name], exact, lowprec)
            del exact, lowprec
            if trial.outcome != Outcome.PASSED:
                raise KernelStageFailure(name, trial.outcome, f"the outputs of timed call {i + 1} are wrong (it "
                                                              f"behaves differently while timed): {trial.message}")
        elif delivered.returned != "dict" or not all(o.copied for o in delivered.outputs.values()) \
                or len(delivered.outputs) != len(task.outputs):
            raise KernelStageFailure(name, Outcome.INCORRECT_SHAPE,
                                     f"timed call {i + 1} returned outputs that do not fit the task")
        return us, wall

    made = {}  # the operands that are no input, made once for every set
    ab = [task.gemm_operand_sets(x, dims, made) for x in private]
    from epiforge.primitives.config import GemmConfig

    stage("baselines")
    plain, skipped = gemm_candidates(task, dims, ab, [GemmConfig.parse(c) for c in kernel_configs], device)
    extra, extra_notes, extra_skipped = extra_baselines(baselines, task, dims, private, device)
    remotes.update({n: f for n, f in extra.items() if hasattr(f, "timed_us")})  # timed in their own process
    stage("warmup")
    local = {**plain, "eager": lambda j: task.unfused(private[j], dims), **extra}

    def local_rep(name: str, j: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        us = remotes[name].timed_us(j) if name in remotes else timed_call(lambda: local[name](j), clock=clock)
        return us, (time.perf_counter() - t0) * 1e6

    names = [*(f"kernel:{k}" for k in kernels), *local]
    rtt = {}
    for name, kp in kernels.items():
        try:
            for i in range(warmup):
                kp.ask({"op": "time", "set": sets[name][i % rotate].name}, stage="benchmark")
            rtt[name] = _round_trip_us(kp)
        except KernelFailure as f:
            raise KernelStageFailure(name, Outcome(f.outcome), f.message) from None
    for i in range(warmup):
        for name in local:
            local_rep(name, i % rotate)
    stage("benchmark")
    samples = {n: [] for n in names}
    walls = {n: [] for n in names}
    # each kernel's null call (its runner's timing procedure alone) takes its place among the
    # timed calls, so that its wall - claimed is measured in the GPU state the kernel's calls
    # saw: the lead (eval/timing.py) lasts longer on a GPU held at its power cap
    nulls = {f"null:{k}": k for k in kernels}
    null_gaps = {k: [] for k in kernels}
    with gpu_clocks() if device == "cuda" else ClockSampler(skip="timed on the host's clock: no GPU") as clocks:
        for i in range(reps):
            j = i % rotate
            refresh(i, j)
            if i == profile_at:
                for name, kp in kernels.items():
                    try:
                        ok, line, _ = check_launches(task, kp, sets[name][j].name, "benchmark")
                    except KernelFailure as f:
                        raise KernelStageFailure(name, Outcome(f.outcome), f.message) from None
                    if not ok:
                        raise KernelStageFailure(name, Outcome.EXTRA_LAUNCHES, f"a call during the timed phase: {line}")
            for name in order.sample([*names, *nulls], len(names) + len(nulls)):
                if name in nulls:
                    try:
                        null_gaps[nulls[name]].append(_null_gap(kernels[nulls[name]]))
                    except KernelFailure as f:
                        raise KernelStageFailure(nulls[name], Outcome(f.outcome), f.message) from None
                    continue
                us, wall = kernel_rep(name[7:], i, j) if name.startswith("kernel:") else local_rep(name, j)
                samples[name].append(us)
                walls[name].append(wall)
    for b in bufs.values():
        b.close()
    null = {k: statistics.median(gaps) for k, gaps in null_gaps.items()}
    for name, remote in remotes.items():  # one that failed while timed is left out, with why
        if remote.failed:
            names.remove(name)
            del samples[name], walls[name]
            extra_skipped[name] = f"failed while timed: {remote.failed}"
            extra_notes.pop(name, None)
    summary = clocks.summary()
    timings = {n: summarize(samples[n], keep=True, clocks=summary) for n in names}
    sol = fastest({n: timings[n] for n in plain}, timings["cublas"])
    timings["gemm_only"] = timings[sol]
    notes = {"gemm_only": f"the speed of light: {sol}, the fastest of {', '.join(plain)}",
             "cublas": "torch.mm of the task's GEMM in its shape and operand layouts" if task.gemm_count == 1
             else f"torch.mm of each of the task's {task.gemm_count} GEMMs, in their shapes and operand layouts",
             "eager": "the task's unfused PyTorch, eager",
             **extra_notes, **{n: f"left out: {why}" for n, why in {**skipped, **extra_skipped}.items()}}
    out = {}
    for name in kernels:
        me = f"kernel:{name}"
        mine = {"kernel": timings[me], **{n: t for n, t in timings.items() if n != me}}
        # the judge's own gap: its own timed calls (a remote baseline's wall holds its IPC too)
        own = {"kernel": samples[me], **{n: v for n, v in samples.items() if not n.startswith("kernel:")
                                         and n not in remotes}}
        own_walls = {"kernel": walls[me], **{n: v for n, v in walls.items() if not n.startswith("kernel:")
                                             and n not in remotes}}
        out[name] = ShapeTiming.measured(mine, wall_check=wall_check(own, own_walls, rtt[name], null[name], device),
                                         checked_calls=checked[name], notes=notes)
    return out


def _null_gap(kp: KernelProcess) -> float:
    """wall - claimed for one call of the runner's procedure alone (flush, lead, sync, IPC, no kernel)."""
    t0 = time.perf_counter()
    us = kp.parse(Timed, kp.ask({"op": "time", "null": True}, stage="benchmark"), "benchmark").us
    return (time.perf_counter() - t0) * 1e6 - us


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
               runner_null_gap_us: float | None = None, device: str = "cuda") -> dict:
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
    slack_us, fraction = (WALL_SLACK_US, WALL_SLACK_FRACTION) if device == "cuda" else \
        (CPU_WALL_SLACK_US, CPU_WALL_SLACK_FRACTION)
    allowed = base + max(slack_us, fraction * claimed)
    return {"kernel_gap_us": round(kernel_gap, 1), "judge_gap_us": round(own_gap, 1), "round_trip_us": round(rtt_us, 1),
            "runner_null_gap_us": None if runner_null_gap_us is None else round(runner_null_gap_us, 1),
            "allowed_gap_us": round(allowed, 1), "ok": kernel_gap <= allowed}


def run_gpu_stages(task, kp: KernelProcess, shape, shape_result, master_seed: int, shape_index: int, *, stage,
                   ceilings: Ceilings, reps: int = 50, warmup: int = 5, shapes_name: str = "smoke",
                   device: str = "cuda", timed: bool = True) -> None:
    """Fill shape_result (launches, timing, outcome) in place. `stage(name)` reports progress.
    timed=False: the launch check only."""
    run_timed_stages(task, {"kernel": (kp, shape_result)}, shape, master_seed, shape_index, stage=stage,
                     ceilings=ceilings, reps=reps, warmup=warmup, shapes_name=shapes_name, device=device, timed=timed)


def run_timed_stages(task, kernels: dict[str, tuple[KernelProcess, object]], shape, master_seed: int,
                     shape_index: int, *, stage, ceilings: Ceilings, reps: int = 50, warmup: int = 5,
                     shapes_name: str = "smoke", device: str = "cuda", timed: bool = True,
                     baselines: list[str] = (), untimed_why: str = "asked for numerics and launches only") -> None:
    """The timed stages for several kernels of one task at once ({name: (runner, its
    ShapeResult)}, filled in place): each kernel's launch check, then (unless timed=False,
    said in each message with untimed_why) ONE interleaved run of all that passed it (a kernel that fails there is dropped and the run starts again without
    it), then each one's recheck and plausibility."""
    dims = shape.dims()
    active = {}
    stage("launches")
    for name, (kp, res) in kernels.items():
        try:
            set_name = f"l{shape_index}"
            _put(task, kp, set_name, task.make_inputs(dims, derive_seed(master_seed, shape_index, 50), device),
                 "launches", device)
            ok, launch_line, names = check_launches(task, kp, set_name, "launches")
            kp.ask({"op": "drop", "set": set_name}, stage="launches")
        except KernelFailure as f:
            res.outcome, res.message = Outcome(f.outcome), f.message
            continue
        res.launches = names
        if not ok:
            res.outcome, res.message = Outcome.EXTRA_LAUNCHES, launch_line
        elif not timed:
            res.message = f"{launch_line}; not timed ({untimed_why})"
        else:
            active[name] = launch_line
    if not active:
        return
    summaries = {}
    while active:
        try:
            configs = sorted({c for n in active for c in kernels[n][1].gemm_configs})
            summaries = benchmark(task, {n: kernels[n][0] for n in active}, shape, master_seed, shape_index, reps=reps,
                                  warmup=warmup, rotate=ROTATE.get(shapes_name, 2), device=device,
                                  kernel_configs=configs, baselines=baselines, stage=stage)
            break
        except KernelStageFailure as f:
            res = kernels[f.name][1]
            res.outcome, res.message = f.outcome, f.message  # never timed: no speed shown
            del active[f.name]
        finally:
            for n in list(active):
                try:
                    kernels[n][0].ask({"op": "drop", "set": "*"}, stage="benchmark")
                except KernelFailure as f:
                    kernels[n][1].outcome, kernels[n][1].message = Outcome(f.outcome), f.message
                    del active[n]
    if device == "cuda":
        torch.cuda.empty_cache()
    if not active:
        return
    stage("recheck")
    rechecked = {}
    for name, launch_line in active.items():
        kp, res = kernels[name]
        try:
            trial = run_trial(task, kp, dims, derive_seed(master_seed, shape_index, 200), device, "kernel_first",
                              f"r{shape_index}")
        except KernelFailure as f:
            res.outcome, res.message = Outcome(f.outcome), f.message
            continue
        if trial.outcome != Outcome.PASSED:
            res.outcome, res.message = trial.outcome, f"after timing, on new inputs: {trial.message}"
            continue
        rechecked[name] = launch_line
    if rechecked:
        stage("plausibility")
    for name, launch_line in rechecked.items():
        _plausibility(task, dims, summaries[name], kernels[name][1], launch_line, ceilings)


def _plausibility(task, dims, summary: ShapeTiming, shape_result, launch_line: str, ceilings: Ceilings) -> None:
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
