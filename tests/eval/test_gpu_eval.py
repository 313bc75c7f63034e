"""The evaluator on a Hopper GPU (marker `gpu`; skipped elsewhere). On the H200:

    .venv/bin/python -m pytest -m gpu tests/eval tests/exploits

Every expert kernel PASSES with its launches checked and timings against GEMM-only; an
illegal memory access and a device OOM are typed and the next candidate passes; ceilings
set absurdly low make an honest kernel IMPLAUSIBLE (the plausibility wiring)."""

from pathlib import Path

import pytest

from epiforge import tasks
from epiforge.eval.machine import expert_kernel
from epiforge.eval import evaluate

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
EXPLOITS = REPO / "tests" / "exploits"
TASKS = [t.name for t in tasks.load_catalogue()[0] if expert_kernel(t.name)]  # the expert track


@pytest.mark.parametrize("task", TASKS)
def test_expert_kernel_passes_on_the_gpu(task):
    r = evaluate(task, "human", device="gpu", shapes="smoke", seed=5, reps=20)
    assert r.outcome.value == "PASSED", f"{r.stage}: {r.message}\n{r.stderr_tail[-2000:]}"
    assert r.stage == "done" and r.environment.get("gpu") and r.ranked and not r.provisional
    # by default in every precision the task lists: the named shapes, then two hidden ones, each; the first timed
    assert [(s.dtype, s.hidden) for s in r.per_shape] == [(p, h) for p in ("bfloat16", "float16")
                                                          for h in (False, False, True, True)]
    assert all(s.timing is None for s in r.per_shape if s.dtype == "float16")
    for s in [s for s in r.per_shape if not s.hidden and s.dtype == "bfloat16"]:
        assert s.trials == 2 and s.launches and "GemmMod" in s.launches[0]
        t = s.timing
        assert t.kernel.n == 20 and t.kernel.median_us > 0 and t.baselines["gemm_only"].median_us > 0
        over = t.fused_over_gemm_only  # per-repetition ratios (eval.stats.paired_ratio)
        assert 0 < over.q1 <= over.median <= over.q3 and over.ci_low <= over.median <= over.ci_high
        assert t.kernel.samples_us == [] and t.roofline["floor_us"] < t.kernel.median_us
        assert t.wall_check["ok"] and t.checked_calls >= 1
        # the judge sampled the GPU's clocks through the timed phase (eval/clocks.py)
        assert t.kernel.clocks.absent is None and t.kernel.clocks.sm_mhz_median > 500
        assert t.baselines["cublas"].clocks == t.kernel.clocks


@pytest.mark.parametrize("dtype, timed", [("all", "bfloat16"), ("float16", "float16")])
def test_every_precision_asked_for_is_launch_checked_and_the_first_is_timed(dtype, timed):
    r = evaluate("k7", "human", device="gpu", shapes="smoke", seed=5, reps=20, dtype=dtype)
    assert r.outcome.value == "PASSED", f"{r.stage}: {r.message}\n{r.stderr_tail[-2000:]}"
    precisions = ["bfloat16", "float16"] if dtype == "all" else ["float16"]
    assert [(s.dtype, s.hidden) for s in r.per_shape] == [(p, h) for p in precisions for h in (False, False, True, True)]
    for s in [s for s in r.per_shape if not s.hidden]:
        assert s.launches and "GemmMod" in s.launches[0]
        assert (s.timing is not None) == (s.dtype == timed), (s.dtype, s.message)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["k1_gemm_rmsnorm", "k9_gemm_partial_cross_entropy"])
def test_expert_kernel_passes_at_paper_shapes(task):
    r = evaluate(task, "human", device="gpu", shapes="paper", seed=5, reps=20)
    assert r.passed, f"{r.stage}: {r.message}\n{r.stderr_tail[-2000:]}"
    assert all(s.timing.fused_over_gemm_only.median < 1.5 for s in r.per_shape if not s.hidden and s.timing)


@pytest.mark.parametrize("fault,kw", [
    # the kernel's own process must reach the GPU for its fault to happen there: launcher=False
    ("illegal_memory_access", {"static_checks": False, "launcher": False}),
    ("memory_blowup", {}),  # device OOM: torch.empty is allowed, a terabyte is not there
])
def test_the_next_candidate_passes_after_a_gpu_fault(fault, kw):
    bad = evaluate("k1", str(EXPLOITS / f"{fault}.py"), device="gpu", seed=3, **kw)
    assert bad.outcome.value == "RUNTIME_ERROR", bad.message + bad.stderr_tail[-1500:]
    assert ("illegal memory access" in bad.message or "CUDA error" in bad.message) if fault.startswith("illegal") \
        else "out of memory" in bad.message
    good = evaluate("k1", "human", device="gpu", seed=3, reps=10)
    assert good.passed, good.message + good.stderr_tail[-1500:]


def test_in_launcher_mode_a_faulting_kernel_never_reaches_the_gpu():
    """The kernel's process only describes, on a CPU runner: the Triton launch that would
    fault on the GPU fails there, before anything runs on the device."""
    bad = evaluate("k1", str(EXPLOITS / "illegal_memory_access.py"), device="gpu", seed=3, static_checks=False)
    assert bad.outcome.value == "RUNTIME_ERROR", bad.message + bad.stderr_tail[-1500:]
    assert "illegal memory access" not in bad.message and "CUDA error" not in bad.message, bad.message
    assert "op_describe" in bad.stderr_tail, bad.stderr_tail[-1500:]  # it failed describing, on the CPU runner
    assert bad.environment.get("judge_mode", "").startswith("launcher"), bad.environment


def test_absurd_ceilings_make_an_honest_kernel_implausible(monkeypatch):
    monkeypatch.setenv("EPIFORGE_PEAK_TFLOPS", "0.000001")  # read by the judge
    r = evaluate("k1", "human", device="gpu", seed=3, reps=10)
    assert r.outcome.value == "IMPLAUSIBLE" and "quarantined" in r.message
    assert r.timed and not r.ranked  # the timing is kept, never ranked
