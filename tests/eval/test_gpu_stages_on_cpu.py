"""The timed stages (eval/gpu_stages.py) driven for real on a CPU: a real runner process,
the real launch check (the primitives' record, as the CPU has no profiler), the real
interleaved repetitions with every timed output checked, the wall-clock check, the
fresh-input trial after timing and plausibility; only the clock is the host's. evaluate()
never times on a CPU; this is how the judge's timed phase is tested in CI. The real
thing: tests/eval/test_gpu_eval.py on the H200."""

import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from epiforge import tasks
from epiforge.eval import gpu_stages, numerics
from epiforge.eval.plausibility import Ceilings
from epiforge.eval.remote import KernelProcess

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

REPO = Path(__file__).resolve().parents[2]
ROW_SCALE = ("import torch\nimport primitives as P\nTASK = 'k1_gemm_rmsnorm'\ncalls = [0]\n\n"
             "@P.epilogue(operands={'rstd': P.PerRow()})\ndef row_scale(acc, rstd):\n    return {'D': acc * rstd}\n\n"
             "def honest(inputs):\n    return {'out': row_scale(inputs['h'], inputs['w'], rstd=inputs['rstd'])['D']}\n\n")


@contextmanager
def runner(kernel: Path, tmp_path: Path):
    kp = KernelProcess(tmp_path / "runner", deadline=time.monotonic() + 600)
    try:
        kp.ask({"op": "load", "path": str(kernel), "device": "cpu"}, stage="load")
        yield kp
    finally:
        kp.close()


def stages_of(task_name, kernel: Path, tmp_path, ceilings=Ceilings(), reps=6):
    task = tasks.get_task(task_name)
    shape = tasks.shape_sets()["smoke"][1]
    with runner(kernel, tmp_path) as kp:
        res = numerics.check_shape(task, kp, shape, 5, 1, "cpu")
        assert res.outcome.value == "PASSED", res.message
        stages = []
        gpu_stages.run_gpu_stages(task, kp, shape, res, 5, 1, stage=stages.append, ceilings=ceilings, reps=reps,
                                  shapes_name="smoke", device="cpu")
    return res, stages


def kernel_file(tmp_path, run_body: str) -> Path:
    path = tmp_path / "k1_candidate.py"
    path.write_text(ROW_SCALE + "def run(inputs, prepared, config=None):\n    calls[0] += 1\n" + run_body)
    return path


def test_an_expert_kernel_goes_through_every_stage(tmp_path):
    res, stages = stages_of("k0_gemm_residual_partial_rmsnorm", REPO / "human_kernels/k0_gemm_residual_partial_rmsnorm.py",
                            tmp_path)
    assert res.outcome.value == "PASSED" and stages == ["launches", "warmup", "baselines", "warmup", "benchmark", "recheck", "plausibility"], \
        res.message
    t = res.timing
    assert t.kernel.n == 6 and t.baselines["gemm_only"].n == 6 and t.baselines["eager"].n == 6
    over = t.fused_over_gemm_only
    assert over.q1 <= over.median <= over.q3 and over.ci_low <= over.median <= over.ci_high
    assert t.fraction_of_speed_of_light == pytest.approx(1 / over.median)
    assert t.kernel.samples_us == []  # results stay small: the summary only
    # no GPU clock on the host's clock: every timing of the phase says so, none invents a number
    assert t.kernel.clocks.absent == "timed on the host's clock: no GPU" and t.kernel.clocks.sm_mhz_median is None
    assert all(b.clocks == t.kernel.clocks for b in t.baselines.values())
    assert t.wall_check["round_trip_us"] > 0 and t.checked_calls >= 1
    assert t.roofline["floor_us"] > 0 and res.launches[0].startswith("gemm:")
    # the speed of light: the fastest plain GEMM timed, quack's at the kernel's own config among them
    plain = {n: b for n, b in t.baselines.items() if n == "cublas" or n.startswith("quack_gemm@")}
    assert f"quack_gemm@{res.gemm_configs[0]}" in plain and "cublas" in plain
    # which one is picked by paired ratios against cuBLAS (eval.stats.fastest): on a loaded
    # CPU that need not be the smallest median, so only its being one of them is asserted
    assert t.notes["gemm_only"].startswith("the speed of light: ")
    picked = t.notes["gemm_only"].removeprefix("the speed of light: ").split(",")[0]
    assert picked in plain and t.baselines["gemm_only"] == plain[picked]


def test_extra_launches_in_the_timed_phase_are_caught(tmp_path):
    """Honest for the numerics and the launch check (4 calls), then two GEMMs per call
    with the right values: the profiled call slipped into the timed phase sees them."""
    body = ("    if calls[0] <= 4:\n        return honest(inputs)\n"
            "    honest(inputs)\n    return honest(inputs)\n")
    res, stages = stages_of("k1_gemm_rmsnorm", kernel_file(tmp_path, body), tmp_path)
    assert res.outcome.value == "EXTRA_LAUNCHES" and "timed phase" in res.message and res.timing is None
    assert stages == ["launches", "warmup", "baselines", "warmup", "benchmark"]


def test_extra_launches_stop_before_timing(tmp_path):
    body = "    if calls[0] <= 2:\n        return honest(inputs)\n    honest(inputs)\n    return honest(inputs)\n"
    res, stages = stages_of("k1_gemm_rmsnorm", kernel_file(tmp_path, body), tmp_path)
    assert res.outcome.value == "EXTRA_LAUNCHES" and stages == ["launches"] and res.timing is None
    assert "2 fused GEMMs" in res.message


def test_absurd_ceilings_quarantine_the_timing(tmp_path):
    res, _ = stages_of("k1_gemm_rmsnorm", REPO / "human_kernels/k1_gemm_rmsnorm.py", tmp_path,
                       ceilings=Ceilings(1e-9, 1e-9))
    assert res.outcome.value == "IMPLAUSIBLE" and "quarantined" in res.message and res.timing


@pytest.mark.parametrize("body,outcome,fragment", [
    # right until it is timed, then zeros: fast exactly where it counts
    ("    if calls[0] > 4:\n        return {'out': torch.zeros(inputs['h'].shape[0], inputs['w'].shape[0],"
     " dtype=torch.bfloat16)}\n    return honest(inputs)\n", "INCORRECT_NUMERICS", "timed call"),
    # right on the first timed calls, then wrong: each timed call may be the checked one
    ("    out = honest(inputs)\n    if calls[0] > 15:\n        out['out'] = out['out'] * 1.5\n    return out\n",
     "INCORRECT_NUMERICS", "wrong (it behaves differently while timed)"),
    # returns the same tensor on every timed call (a cache: free when timed)
    ("    global CACHE\n    if calls[0] > 4:\n        if 'CACHE' not in globals():\n            CACHE = honest(inputs)\n"
     "        return CACHE\n    return honest(inputs)\n", "RUNTIME_ERROR", "fresh buffers"),
    # a copy of its first timed output for each set of weights, in new storage: the inputs
    # have new values on every timed call, so the copy is wrong where it is checked
    ("    global SEEN\n    if 'SEEN' not in globals():\n        SEEN = {}\n    key = id(inputs['w'])\n"
     "    if calls[0] > 9 and key in SEEN:\n        return {'out': SEEN[key]['out'].clone()}\n"
     "    out = honest(inputs)\n    if calls[0] > 4:\n        SEEN[key] = out\n    return out\n",
     "INCORRECT_NUMERICS", "timed call"),
])
def test_a_kernel_that_changes_when_timed_is_caught(tmp_path, body, outcome, fragment):
    res, stages = stages_of("k1_gemm_rmsnorm", kernel_file(tmp_path, body), tmp_path, reps=12)
    assert res.outcome.value == outcome and fragment in res.message, res.message
    assert res.timing is None and stages[-1] in ("warmup", "benchmark")  # never shows a speed


def test_a_kernel_that_claims_less_time_than_it_took_is_implausible(tmp_path):
    """Behind the static rules a kernel can change the runner's clock: here each call made
    by the timer (found on the stack) sleeps 60 ms and leaves the timer's next clock reading
    55 ms short, the clock put back at once (so the tamper check finds it untouched), and the
    runner reports ~5 ms a call. The judge's own wall clock over the same calls does not
    agree: IMPLAUSIBLE (the timing is quarantined, never shown as a speed)."""
    body = ("    out = honest(inputs)\n    f = sys._getframe(1)\n    names = []\n"
            "    while f is not None and len(names) < 4:\n        names.append(f.f_code.co_name)\n        f = f.f_back\n"
            "    if 'timed_call' in names:\n        time.sleep(0.06)\n"
            "        def short():\n            time.perf_counter = REAL\n            return REAL() - 0.055\n"
            "        time.perf_counter = short\n    return out\n")
    path = kernel_file(tmp_path, body)
    path.write_text("import sys\nimport time\nREAL = time.perf_counter\n" + path.read_text())
    res, stages = stages_of("k1_gemm_rmsnorm", path, tmp_path, reps=8)
    assert res.outcome.value == "IMPLAUSIBLE" and "do not account for the judge's wall clock" in res.message, res.message
    assert res.timing is not None and res.timing.wall_check["ok"] is False
    assert res.timing.wall_check["kernel_gap_us"] > 40_000  # the 55 ms the clock was set back, less noise


def test_timed_calls_are_checked_on_a_sample_drawn_from_the_seed(tmp_path):
    res, _ = stages_of("k1_gemm_rmsnorm", REPO / "human_kernels/k1_gemm_rmsnorm.py", tmp_path, reps=30)
    assert res.outcome.value == "PASSED", res.message
    assert 1 <= res.timing.checked_calls < 30  # some, not all: which ones the kernel cannot know


def test_asked_for_baselines_are_timed_beside_or_say_why_not(tmp_path):
    task = tasks.get_task("k2_gemm_rmsnorm_swiglu")
    shape = tasks.shape_sets()["smoke"][0]
    with runner(REPO / "human_kernels/k2_gemm_rmsnorm_swiglu.py", tmp_path) as kp:
        res = numerics.check_shape(task, kp, shape, 5, 0, "cpu")
        gpu_stages.run_timed_stages(task, {"expert": (kp, res)}, shape, 5, 0, stage=lambda s: None,
                                    ceilings=Ceilings(), reps=5, device="cpu",
                                    baselines=["quack_library", "liger", "flashinfer"])
    t = res.timing
    assert res.outcome.value == "PASSED", res.message
    assert "quack_library" in t.baselines and "quack_library" in t.speedup  # quack's norm_swiglu_mod, emulated
    # FlashInfer does not import on a CPU: left out, saying why (on the H200 it is timed)
    assert t.notes["flashinfer"].startswith("left out: FlashInfer is not installed here")
    assert "liger" in t.baselines or t.notes["liger"].startswith("left out:")
    with pytest.raises(ValueError, match="unknown baseline"):
        from epiforge.eval.baselines import extra_baselines

        extra_baselines(["nonsense"], task, shape.dims(), [], "cpu")


def test_a_shape_left_untimed_says_why_in_the_callers_words(tmp_path):
    """timed=False: the launch check only, and the message gives the caller's reason (the
    judge: a second precision, of which only the first is timed)."""
    task = tasks.get_task("k1_gemm_rmsnorm")
    shape = tasks.shape_sets()["smoke"][0]
    with runner(REPO / "human_kernels/k1_gemm_rmsnorm.py", tmp_path) as kp:
        res = numerics.check_shape(task, kp, shape, 5, 0, "cpu")
        gpu_stages.run_timed_stages(task, {"expert": (kp, res)}, shape, 5, 0, stage=lambda s: None,
                                    ceilings=Ceilings(), reps=5, device="cpu", timed=False,
                                    untimed_why="only bfloat16 is timed")
    assert res.outcome.value == "PASSED" and res.timing is None
    assert res.message.endswith("; not timed (only bfloat16 is timed)"), res.message
