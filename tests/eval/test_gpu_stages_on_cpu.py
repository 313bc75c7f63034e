"""The GPU stages' logic (eval/gpu_stages.py) driven on a CPU: only the calls that need a
GPU are stood in for (the CUDA-event timer by a wall-clock one, the profiler by a given
launch list, CUDA inputs by CPU ones). What runs is the real stage code: the launch
verdict, the interleaved benchmark's summary, the re-check of the timed outputs, the
fresh-input trial after timing, and plausibility. The real thing: tests/eval/test_gpu_eval.py
on the H200."""

import statistics
import time

import pytest
import torch

import tasks
from eval import gpu_stages
from eval import numerics
from eval.guard import TamperCheck
from eval.kernel import load_kernel_module
from eval.launches import FINISHER_KERNELS, Launch
from eval.plausibility import Ceilings
from eval.timing import summarize

GEMM = "kernel_cutlass_kernel_quackepiloguefrontendGemmMod_row_scale_0"


@pytest.fixture
def cpu_gpu(monkeypatch):
    """Stand-ins for the CUDA-only calls; returns a setter for the launches 'seen'."""
    def wall_clock_interleaved(fns, warmup, reps):
        out = {}
        for name, (fn, sets) in fns.items():
            samples = []
            for i in range(reps):
                t0 = time.perf_counter()
                fn(*sets[i % len(sets)])
                samples.append((time.perf_counter() - t0) * 1e6)
            out[name] = summarize(samples, keep=True)
        seen["timed"] = out
        return out

    def cpu_inputs(task, dims, seed, module):
        inputs = task.make_inputs(dims, seed, "cpu")
        consts = {t.name: inputs[t.name].clone() for t in task.inputs if t.constant}
        return inputs, numerics.freeze_prepared(module.prepare(consts) if hasattr(module, "prepare") else {})

    real_trial = gpu_stages.run_trial
    seen = {"launches": None, "timed": None}

    def profiled(fn):
        fn()
        return seen["launches"], 7

    monkeypatch.setattr(gpu_stages, "time_cuda_interleaved", wall_clock_interleaved)
    monkeypatch.setattr(gpu_stages, "_inputs", cpu_inputs)
    monkeypatch.setattr(gpu_stages, "profile_launches", profiled)
    monkeypatch.setattr(gpu_stages, "run_trial", lambda task, module, dims, seed, device, order, tamper=None:
                        real_trial(task, module, dims, seed, "cpu", order, tamper=tamper))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return seen


def stages_of(task_name, kernel_path, seen, ceilings=Ceilings(), launches=None):
    task = tasks.get_task(task_name)
    module = load_kernel_module(kernel_path)
    shape = tasks.shape_sets()["smoke"][1]
    seen["launches"] = launches if launches is not None else (
        [Launch(GEMM, 7)] + [Launch(FINISHER_KERNELS[f], 7) for f in task.launches[1:]])
    res, _ = numerics.check_shape(task, module, shape, 5, 1, "cpu")
    assert res.outcome.value == "PASSED", res.message
    stages = []
    gpu_stages.run_gpu_stages(task, module, shape, res, 5, 1, stage=stages.append, tamper=TamperCheck(),
                              ceilings=ceilings, reps=6, shapes_name="smoke")
    return res, stages


def test_an_expert_kernel_goes_through_every_stage(cpu_gpu):
    res, stages = stages_of("k0_gemm_residual_partial_rmsnorm", "human_kernels/k0_gemm_residual_partial_rmsnorm.py", cpu_gpu)
    assert res.outcome.value == "PASSED" and stages == ["launches", "benchmark", "recheck", "plausibility"]
    t = res.timing
    assert t["kernel"]["n"] == 6 and t["gemm_only"]["n"] == 6 and t["eager"]["n"] == 6
    # ratios repetition by repetition, from the samples the timer gave
    timed = cpu_gpu["timed"]
    per_rep = [k / g for k, g in zip(timed["kernel"].samples_us, timed["gemm_only"].samples_us)]
    assert t["fused_over_gemm_only"] == pytest.approx(statistics.median(per_rep))
    assert t["speedup"]["eager"] == pytest.approx(
        statistics.median(e / k for e, k in zip(timed["eager"].samples_us, timed["kernel"].samples_us)))
    assert t["fused_over_gemm_only_iqr"][0] <= t["fused_over_gemm_only"] <= t["fused_over_gemm_only_iqr"][1]
    assert "samples_us" not in t["kernel"]  # results stay small: the summary only
    assert t["roofline"]["floor_us"] > 0 and res.launches[0] == GEMM and "GEMM-only" in res.message


def test_extra_launches_stop_before_timing(cpu_gpu):
    res, stages = stages_of("k1_gemm_rmsnorm", "human_kernels/k1_gemm_rmsnorm.py", cpu_gpu,
                            launches=[Launch("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_TNN", 7)])
    assert res.outcome.value == "EXTRA_LAUNCHES" and stages == ["launches"] and res.timing is None


def test_absurd_ceilings_quarantine_the_timing(cpu_gpu):
    res, _ = stages_of("k1_gemm_rmsnorm", "human_kernels/k1_gemm_rmsnorm.py", cpu_gpu, ceilings=Ceilings(1e-9, 1e-9))
    assert res.outcome.value == "IMPLAUSIBLE" and "quarantined" in res.message and res.timing


def test_a_kernel_that_skips_work_when_timed_is_caught(cpu_gpu, tmp_path):
    src = (tmp_path / "skipper.py")
    # correct for its first 4 calls of a shape (2 trials, the launch check's warm and
    # profiled calls), then zeros: fast exactly where it is timed
    src.write_text(
        "import torch\nimport primitives as P\nTASK = 'k1_gemm_rmsnorm'\ncalls = [0]\n\n"
        "@P.epilogue(operands={'rstd': P.PerRow()})\ndef row_scale(acc, rstd):\n    return {'D': acc * rstd}\n\n"
        "def run(inputs, prepared, config=None):\n    calls[0] += 1\n    if calls[0] > 4:\n"
        "        return {'out': torch.zeros(inputs['h'].shape[0], inputs['w'].shape[0], dtype=torch.bfloat16)}\n"
        "    return {'out': row_scale(inputs['h'], inputs['w'], rstd=inputs['rstd'])['D']}\n")
    res, stages = stages_of("k1_gemm_rmsnorm", str(src), cpu_gpu)
    assert res.outcome.value == "INCORRECT_NUMERICS" and stages[-1] == "recheck"
    assert "timed call" in res.message and res.timing is None  # never shows a speed
