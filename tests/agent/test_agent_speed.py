"""The agent reads the evaluator's GPU timing (eval/gpu_stages.py's per-shape summary) and
applies the speed target to it."""

from agent.feedback import shape_times, speed_ratio
from eval.result import Outcome, Result, ShapeResult
from eval.timing import Timing


def _summary(kernel_us, gemm_us, eager_us):
    """The shape of eval.gpu_stages' timing summary."""
    t = {name: Timing(median_us=v, q1_us=v, q3_us=v, min_us=v, n=5).model_dump()
         for name, v in (("kernel", kernel_us), ("gemm_only", gemm_us), ("eager", eager_us))}
    t["fused_over_gemm_only"] = kernel_us / gemm_us
    t["gemm_fraction"] = gemm_us / kernel_us
    t["speedup"] = {"gemm_only": gemm_us / kernel_us, "eager": eager_us / kernel_us}
    return t


def test_speed_ratio_from_the_evaluators_timing():
    shapes = [ShapeResult(shape=s, dims={}, outcome=Outcome.PASSED, timing=_summary(k, g, e))
              for s, k, g, e in (("1B", 110.0, 100.0, 150.0), ("7B", 404.0, 400.0, 500.0))]
    r = Result(task="k1_gemm_rmsnorm", kernel="x.py", kernel_sha256="0", track="candidate", device="cuda",
               shapes="paper", outcome=Outcome.PASSED, per_shape=shapes)
    kernel, gemm, baselines = shape_times(shapes[0].timing)
    assert (kernel, gemm) == (110.0, 100.0) and baselines == {"eager": 150.0}
    assert abs(speed_ratio(r) - 1.10) < 1e-9  # the worst shape
    from agent.feedback import describe

    shapes[0].launches = ["kernel_cutlass_kernel_quackepiloguefrontendGemmMod_row_scale", "_row_fold"]
    text = describe(r, what="check")
    assert "1B launches: kernel_cutlass_kernel_quackepiloguefrontendGemmMod_row_scale, _row_fold" in text
    assert "1B timing:" in text
    # the evaluator's per-repetition ratio, where it gave one, wins over the ratio of medians
    shapes[1].timing.update(fused_over_gemm_only=1.2, fused_over_gemm_only_iqr=[1.15, 1.25])
    assert abs(speed_ratio(r) - 1.2) < 1e-9
    assert "(ratio 1.200, quartiles 1.150-1.250)" in describe(r, what="check")
    del shapes[1].timing["fused_over_gemm_only"]
    assert abs(speed_ratio(r) - 1.10) < 1e-9  # 404 / 400 from the medians
    untimed = r.model_copy(update={"per_shape": [ShapeResult(shape="s", dims={}, outcome=Outcome.PASSED)]})
    assert speed_ratio(untimed) is None
