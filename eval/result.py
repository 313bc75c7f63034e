"""Result: one evaluation of one kernel on one task's shape set on one machine.

Built through its two factories, never field by field: `Result.stopped` (a verdict reached
before or outside the judge's per-shape stages: the static stage, a judge that ended
without one) and `Result.judged` (the judge's verdict after its shapes). Read back from a
file or a store with `Result.model_validate`. Its validator holds the invariants every
Result keeps, however it was made: a verdict other than PASSED says why, a PASSED one ended
at stage "done", and only a shape that passed its checks (or whose timing was quarantined
as IMPLAUSIBLE) carries a timing."""

from __future__ import annotations

import datetime as _dt
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from epiforge.eval.stats import Timing, paired_ratio
from epiforge.tasks.spec import Precision
from epiforge.tasks.tolerance import OutputCheck


class Outcome(str, Enum):
    PASSED = "PASSED"
    STATIC_REJECTED = "STATIC_REJECTED"
    COMPILE_ERROR = "COMPILE_ERROR"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    TIMEOUT = "TIMEOUT"
    INCORRECT_NUMERICS = "INCORRECT_NUMERICS"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    EXTRA_LAUNCHES = "EXTRA_LAUNCHES"
    IMPLAUSIBLE = "IMPLAUSIBLE"
    TASK_ERROR = "TASK_ERROR"  # the task's own code (reference.py) failed: not the kernel's fault


#: outcomes that say nothing about the kernel: never counted against it
NOT_THE_KERNELS_FAULT = frozenset({Outcome.TASK_ERROR})


#: the stages in the order they run; a Result's `stage` names the one it stopped in
STAGES = ("static", "load", "compile", "numerics", "launches", "warmup", "baselines", "benchmark", "recheck", "plausibility", "done")


class RatioStat(BaseModel):
    """A ratio taken repetition by repetition in one interleaved run (eval.timing.paired_ratio):
    the median of a_i / b_i, its quartiles, and where computed its 95% bootstrap interval."""

    median: float = Field(gt=0)
    q1: float = Field(gt=0)
    q3: float = Field(gt=0)
    ci_low: float | None = None
    ci_high: float | None = None

    @classmethod
    def of(cls, ratio) -> "RatioStat":
        return cls(median=ratio.median, q1=ratio.q1, q3=ratio.q3, ci_low=ratio.ci_low, ci_high=ratio.ci_high)


class ShapeTiming(BaseModel):
    """One shape's times from ONE interleaved run and the ratios taken from them, made by
    ShapeTiming.measured (the evaluator's timed phase; bench's results are imported the
    same way). Times are microseconds; "gemm_only" is the speed of light the kernel is held
    to (the fastest plain GEMM of the same shape and layouts that was timed)."""

    kernel: Timing
    baselines: dict[str, Timing] = Field(description="every baseline timed beside the kernel, by registry name")
    fused_over_gemm_only: RatioStat = Field(description="kernel_i / gemm_only_i: 1.0 is the speed of light")
    speedup: dict[str, RatioStat] = Field(default_factory=dict, description="baseline_i / kernel_i, per baseline")
    notes: dict[str, str] = Field(default_factory=dict, description="what a baseline computes, where it is not obvious")
    roofline: dict | None = Field(None, description="floor_us and the ceilings it came from (eval/plausibility.py)")
    wall_check: dict | None = Field(None, description="the judge's wall clock against the claimed times")
    checked_calls: int | None = Field(None, description="timed calls whose outputs were checked against references")
    source: str = Field("eval", description="eval: the evaluator's timed phase; bench: imported from lab/results")

    @property
    def fraction_of_speed_of_light(self) -> float:
        return 1.0 / self.fused_over_gemm_only.median

    @classmethod
    def measured(cls, timings: dict[str, Timing], **extra) -> "ShapeTiming":
        """The one factory: from Timings with samples of one interleaved run ("kernel",
        "gemm_only" and any other baselines), every ratio taken per repetition; the
        samples themselves are not kept (results stay small)."""
        kernel = timings["kernel"]
        baselines = {k: v for k, v in timings.items() if k != "kernel"}
        over = paired_ratio(kernel, baselines["gemm_only"], ci=True)
        speedup = {k: RatioStat.of(paired_ratio(v, kernel, ci=True)) for k, v in baselines.items()}
        return cls(kernel=kernel.model_copy(update={"samples_us": []}),
                   baselines={k: v.model_copy(update={"samples_us": []}) for k, v in baselines.items()},
                   fused_over_gemm_only=RatioStat.of(over), speedup=speedup, **extra)


#: a NaN or Inf a kernel produced is reported as such, not as null (JSON and the store)
_KEEP_NAN = ConfigDict(ser_json_inf_nan="constants")


class ShapeResult(BaseModel):
    """The checks (and, when timed, the timings) of one shape."""

    model_config = _KEEP_NAN

    shape: str
    dims: dict[str, int]
    dtype: Precision = Field("bfloat16", description="the precision the task ran in at this shape (Task.at); "
                                                     "rows from before fp16 have none: bfloat16")
    outcome: Outcome
    outputs: list[OutputCheck] = []
    message: str = ""
    trials: int = Field(0, description="checked calls on fresh inputs (both orders of reference and kernel)")
    launches: list[str] = Field([], description="GPU: the kernels one run() launched (torch profiler)")
    hidden: bool = Field(False, description="a shape drawn from the secret seed: its dims, indices and values are withheld")
    gemm_configs: list[str] = Field([], description="the tile configs of the fused GEMMs a checked run() launched (the "
                                                    "runner's record): the speed of light is also timed at them")
    timing: ShapeTiming | None = Field(None, description="only when the kernel was timed: never for a failed check")


class Result(BaseModel):
    model_config = _KEEP_NAN

    task: str
    kernel: str = Field(description="kernel file path as given")
    kernel_sha256: str
    track: str = Field(description="expert | generated | candidate")
    author: str | None = None
    backend: str | None = None
    model: str | None = None
    session: str | None = None
    device: str
    shapes: str = Field(description="shape set name: smoke | paper")
    dtypes: list[Precision] = Field(["bfloat16"], min_length=1,
                                    description="the precisions judged, in order (--dtype); the first is `dtype`. "
                                                "Rows from before fp16 have none: bfloat16")
    outcome: Outcome
    message: str = Field("", description="one line: why it failed, or what passed")
    stderr_tail: str = ""
    per_shape: list[ShapeResult] = []
    compiled: list[dict] = Field([], description="sm_90a cross-compiles done on a CPU (epilogue, config, ok, seconds)")
    stage: str | None = Field(None, description=f"where it stopped: one of {STAGES}")
    worst: dict | None = Field(None, description="INCORRECT_NUMERICS: the worst element (shape, output, index, got, expected, allowed)")
    violations: list[str] = Field([], description="static or run-time rule violations")
    environment: dict = {}
    started_at: str = Field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    wall_s: float | None = None
    stage_s: dict[str, float] = Field({}, description="seconds the judge spent in each stage of this evaluation, "
                                                      "its own startup counted in \"load\"; in a compare, a stage "
                                                      "shared by the kernels counts for each")

    @classmethod
    def stopped(cls, base: dict, outcome: Outcome, stage: str | None, message: str, **fields) -> "Result":
        """A kernel that did not pass, stopped at `stage` before any shape was judged or where
        the judge ended without a verdict. base: the Result fields known before judging
        (task, kernel, its metadata, device, shapes, ...); fields: any others (they override base)."""
        if outcome == Outcome.PASSED:
            raise ValueError("Result.stopped is for a kernel that did not pass")
        return cls(**{**base, **fields}, outcome=outcome, stage=stage, message=message)

    @classmethod
    def judged(cls, base: dict, outcome: Outcome, stage: str, message: str, per_shape: list[ShapeResult],
               **fields) -> "Result":
        """The judge's verdict after its shapes: per_shape as judged, the worst element of a
        failed check found in them (worst_element) unless fields name one."""
        return cls(**{"worst": worst_element(per_shape), **base, **fields}, outcome=outcome, stage=stage,
                   message=message, per_shape=per_shape)

    @model_validator(mode="after")
    def _consistent(self) -> "Result":
        if self.outcome != Outcome.PASSED and not self.message:
            raise ValueError(f"a {self.outcome.value} Result says why: its message is empty")
        if self.outcome == Outcome.PASSED and self.stage not in (None, "done"):
            raise ValueError(f"a PASSED Result ended at stage done, not {self.stage!r}")
        for s in self.per_shape:
            if s.timing is not None and s.outcome not in (Outcome.PASSED, Outcome.IMPLAUSIBLE):
                raise ValueError(f"{s.shape}: a shape whose checks failed ({s.outcome.value}) carries no timing")
        return self

    @property
    def passed(self) -> bool:
        return self.outcome == Outcome.PASSED

    @computed_field(description="PASSED on the CPU emulator only: numerics (and, with compile, the sm_90a build) "
                                "hold, but no GPU ran the kernel, so it is never ranked")
    @property
    def provisional(self) -> bool:
        return self.passed and self.device == "cpu"

    @computed_field(description="the precision this Result is keyed on (the store, the leaderboard, compare's "
                                "versus): the first judged, the only one timed on a GPU")
    @property
    def dtype(self) -> str:
        return self.dtypes[0]

    @property
    def timed(self) -> bool:
        return any(s.timing for s in self.per_shape)

    @property
    def ranked(self) -> bool:
        """Only a PASSED, timed result may be ranked (IMPLAUSIBLE ones keep their timing,
        quarantined)."""
        return self.passed and self.timed and not self.provisional


def worst_element(per_shape: list[ShapeResult]) -> dict | None:
    """The failing output check with the largest error over its allowance."""
    best, score = None, -1.0
    for s in per_shape:
        for c in s.outputs:
            if c.ok or c.problem not in ("tolerance", "rms", "element", "nonfinite"):
                continue
            allowed = c.allowed
            if c.problem == "element" and None not in (c.element_excess, c.element_allowed, c.got, c.expected):
                # that element's own allowance: its error less the excess, plus the floor
                allowed = abs(c.got - c.expected) - c.element_excess + c.element_allowed
                ratio = c.element_excess / c.element_allowed if c.element_allowed else float("inf")
            else:
                ratio = float("inf") if c.problem == "nonfinite" or not c.allowed else (c.max_error or 0) / c.allowed
            if ratio > score:
                best, score = {"shape": s.shape, "dtype": s.dtype, "output": c.name, "problem": c.problem, "index": c.worst_index,
                               "got": c.got, "expected": c.expected, "max_error": c.max_error, "allowed": allowed}, ratio
    return best
