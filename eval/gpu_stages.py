"""The GPU-only stages of one shape, after its numerics passed (GPU-ONLY: exercised by the
tests marked `gpu`, tests/eval/test_gpu_eval.py; never run on a CPU).

launches      one warm run(), then one profiled run() on the same inputs (a kernel that
              caches by input shows up with no GEMM): every kernel it launched is judged by
              eval/launches.py, streams included (a marker kernel names the timed stream).
benchmark     eval.timing.time_cuda_interleaved over rotating fresh input sets (each with
              its own prepare()): the kernel, the GEMM-only baseline (cuBLAS torch.mm of the
              task's GEMM shape and layouts) and the eager unfused PyTorch baseline, same
              process, same timer, interleaved repetition by repetition so clock drift falls
              on all three alike. The outputs of the last timed call of each input set are kept.
recheck       those kept outputs against the references of their inputs (a kernel that
              behaves differently while timed fails here), then one more checked trial on
              new inputs (eval/numerics.py).
plausibility  the kernel's median against the roofline floor (eval/plausibility.py).
"""

from __future__ import annotations

import torch

from eval.launches import Launch, classify
from eval.numerics import Breach, derive_seed, freeze_prepared, judge_outputs, references, run_trial
from eval.plausibility import Ceilings, check as plausible
from eval.result import Outcome
from eval.timing import paired_ratio, time_cuda_interleaved

#: input sets the timed calls rotate through (more at small shapes: cheap, and they defeat the cache)
ROTATE = {"smoke": 4, "paper": 2}


def profile_launches(fn) -> tuple[list[Launch], int | None]:
    """(kernels fn launched in order, stream id of the harness's marker kernel)."""
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
    return [Launch(e.name, getattr(e, "device_resource_id", None)) for e in kernels[1:]], stream


def _inputs(task, dims, seed, module):
    inputs = task.make_inputs(dims, seed, "cuda")
    consts = {t.name: inputs[t.name].clone() for t in task.inputs if t.constant}
    prepared = freeze_prepared(module.prepare(consts) if hasattr(module, "prepare") else {})
    return inputs, prepared


def check_launches(task, module, dims, seed) -> tuple[bool, str, list[str]]:
    inputs, prepared = _inputs(task, dims, seed, module)
    module.run(dict(inputs), prepared)  # warm: compiled, allocator grown
    torch.cuda.synchronize()
    launches, stream = profile_launches(lambda: module.run(dict(inputs), prepared))
    verdict = classify(launches, task.launches, stream)
    return verdict.ok, verdict.message, [x.name for x in launches]


def benchmark(task, module, shape, master_seed: int, shape_index: int, *, reps: int, warmup: int, rotate: int):
    """Timings of the kernel and the baselines, plus the outputs of the last timed calls."""
    dims = shape.dims()
    sets = [_inputs(task, dims, derive_seed(master_seed, shape_index, 100 + j), module) for j in range(rotate)]
    last: dict[int, dict] = {}

    def kernel(j):
        inputs, prepared = sets[j]
        last[j] = module.run(dict(inputs), prepared)

    ab = [task.gemm_operands(inputs) for inputs, _ in sets]
    timing = time_cuda_interleaved({
        "kernel": (kernel, [(j,) for j in range(rotate)]),
        "gemm_only": (lambda a, b: torch.mm(a, b.T), ab),
        "eager": (lambda inputs: task.unfused(inputs, dims), [(i,) for i, _ in sets]),
    }, warmup=warmup, reps=reps)
    summary = {name: t.model_dump(exclude={"samples_us"}) for name, t in timing.items()}
    # ratios repetition by repetition (eval.timing.paired_ratio): clock drift cancels
    over = paired_ratio(timing["kernel"], timing["gemm_only"])
    summary["fused_over_gemm_only"] = over.median
    summary["fused_over_gemm_only_iqr"] = [over.q1, over.q3]
    summary["gemm_fraction"] = 1 / over.median
    summary["speedup"] = {"gemm_only": 1 / over.median, "eager": paired_ratio(timing["eager"], timing["kernel"]).median}
    return summary, sets, last


def recheck(task, module, shape, master_seed, shape_index, sets, last, tamper) -> tuple[Outcome, str]:
    dims = shape.dims()
    for j, outputs in sorted(last.items()):  # every input set a timed call used (all, when reps >= rotate)
        exact, lowprec = references(task, sets[j][0], dims)
        verdict = judge_outputs(task, outputs, exact, lowprec)
        del exact, lowprec
        if verdict.outcome != Outcome.PASSED:
            return verdict.outcome, f"the outputs of a timed call are wrong (it behaves differently while timed): {verdict.message}"
    trial = run_trial(task, module, dims, derive_seed(master_seed, shape_index, 200), "cuda", "kernel_first",
                      tamper=tamper)
    if trial.outcome != Outcome.PASSED:
        return trial.outcome, f"after timing, on new inputs: {trial.message}"
    return Outcome.PASSED, ""


def run_gpu_stages(task, module, shape, shape_result, master_seed: int, shape_index: int, *, stage, tamper,
                   ceilings: Ceilings, reps: int = 50, warmup: int = 5, shapes_name: str = "smoke"):
    """Fill shape_result (launches, timing, outcome) in place. `stage(name)` reports progress."""
    dims = shape.dims()
    stage("launches")
    ok, launch_line, names = check_launches(task, module, dims, derive_seed(master_seed, shape_index, 50))
    shape_result.launches = names
    if not ok:
        shape_result.outcome, shape_result.message = Outcome.EXTRA_LAUNCHES, launch_line
        return
    stage("benchmark")
    try:
        summary, sets, last = benchmark(task, module, shape, master_seed, shape_index, reps=reps, warmup=warmup,
                                        rotate=ROTATE.get(shapes_name, 2))
    except Breach as b:
        shape_result.outcome, shape_result.message = b.outcome, b.message
        return
    stage("recheck")
    outcome, message = recheck(task, module, shape, master_seed, shape_index, sets, last, tamper)
    del sets, last
    torch.cuda.empty_cache()
    if outcome != Outcome.PASSED:
        shape_result.outcome, shape_result.message = outcome, message  # never timed: no speed shown
        return
    stage("plausibility")
    good, line, floor = plausible(summary["kernel"]["median_us"], task.flops(dims), task.min_bytes(dims), ceilings)
    base_ok, _, _ = plausible(summary["gemm_only"]["median_us"], task.flops(dims), task.min_bytes(dims), ceilings)
    summary["roofline"] = {"floor_us": floor, "peak_tflops": ceilings.peak_tflops,
                           "bandwidth_tbs": ceilings.bandwidth_tbs, "baseline_below_floor": not base_ok}
    shape_result.timing = summary
    if not good:
        shape_result.outcome, shape_result.message = Outcome.IMPLAUSIBLE, line
        return
    shape_result.message = (f"{summary['fused_over_gemm_only']:.3f}x GEMM-only; {launch_line}; {line}" +
                            ("; note: cuBLAS ran below the floor, the ceilings look low" if not base_ok else ""))

