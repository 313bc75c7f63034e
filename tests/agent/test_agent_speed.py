"""The agent reads the evaluator's GPU timing (eval.result.ShapeTiming, made by its one
factory from the samples of an interleaved run) and applies the speed target to it."""

import statistics

from epiforge.agent.feedback import describe, speed_ratio
from epiforge.eval.result import Outcome, Result, ShapeResult, ShapeTiming
from epiforge.eval.stats import summarize


def _timing(kernel_us, gemm_us, eager_us, drift=(1.0, 1.02, 0.98, 1.01, 0.99)):
    """ShapeTiming.measured from five repetitions whose clock drifts alike for all three."""
    return ShapeTiming.measured({
        "kernel": summarize([kernel_us * d for d in drift], keep=True),
        "gemm_only": summarize([gemm_us * d for d in drift], keep=True),
        "eager": summarize([eager_us * d for d in drift], keep=True),
    })


def test_speed_ratio_from_the_evaluators_timing():
    shapes = [ShapeResult(shape=s, dims={}, outcome=Outcome.PASSED, timing=_timing(k, g, e))
              for s, k, g, e in (("1B", 110.0, 100.0, 150.0), ("7B", 404.0, 400.0, 500.0))]
    base = dict(task="k1_gemm_rmsnorm", kernel="x.py", kernel_sha256="0", track="candidate", device="cuda",
                shapes="paper")
    r = Result.judged(base, Outcome.PASSED, "done", "passed", shapes)
    t = shapes[0].timing
    assert abs(t.fused_over_gemm_only.median - 1.10) < 1e-9 and abs(t.speedup["eager"].median - 150 / 110) < 1e-9
    assert t.kernel.samples_us == [] and t.fraction_of_speed_of_light == 1 / t.fused_over_gemm_only.median
    assert abs(speed_ratio(r) - 1.10) < 1e-9  # the worst shape
    shapes[0].launches = ["kernel_cutlass_kernel_quackepiloguefrontendGemmMod_row_scale", "_row_fold"]
    text = describe(r, what="check")
    assert "1B launches: kernel_cutlass_kernel_quackepiloguefrontendGemmMod_row_scale, _row_fold" in text
    assert "1B timing: kernel 110.0 us, 1.100x GEMM-only" in text and "95% interval" in text
    untimed = r.model_copy(update={"per_shape": [ShapeResult(shape="s", dims={}, outcome=Outcome.PASSED)]})
    assert speed_ratio(untimed) is None


def test_the_ratios_are_taken_repetition_by_repetition():
    # the kernel is 5% slower than the GEMM in every repetition while the clock wanders by 20%
    drift = [1.0, 1.2, 0.9, 1.1, 0.95, 1.15, 1.05]
    t = _timing(105.0, 100.0, 130.0, drift)
    assert abs(t.fused_over_gemm_only.median - 1.05) < 1e-9
    assert t.fused_over_gemm_only.q1 == t.fused_over_gemm_only.q3 == t.fused_over_gemm_only.median
    assert abs(t.baselines["gemm_only"].median_us - 100.0 * statistics.median(drift)) < 1e-9
