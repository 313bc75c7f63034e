"""Timing statistics, torch-free: a function's times over the repetitions of one run, and
ratios of two functions taken repetition by repetition (what every speed claim is made
of). eval/timing.py takes the times; readers of results (the store, the leaderboard) need
only this module."""

from __future__ import annotations

import statistics
from typing import Sequence

from pydantic import BaseModel, Field

from epiforge.eval.clocks import ClockSummary


class Timing(BaseModel):
    """Microseconds per call over n timed repetitions. samples_us: each repetition's time in
    repetition order (time_cuda_interleaved: sample i of every function comes from the same
    repetition, a fraction of a second apart), so that two functions can be compared
    repetition by repetition (paired_ratio). clocks: what the GPU ran at during that run."""

    median_us: float
    q1_us: float
    q3_us: float
    min_us: float
    n: int
    samples_us: list[float] = Field(default_factory=list)
    clocks: ClockSummary | None = Field(None, description="the GPU's SM clock, power and power-cap share over the "
                                        "timed phase this timing came from (eval/clocks.py; every function timed "
                                        "in that phase carries the same summary); its absent says why none was "
                                        "sampled; None: timed before clocks were recorded")

    @property
    def iqr_us(self) -> float:
        return self.q3_us - self.q1_us

    @classmethod
    def of(cls, entry: dict) -> "Timing":
        """The timing in a result file's dict, which may hold other keys beside it (a
        diagnostic's note and config, a library's config)."""
        return cls(**{k: entry[k] for k in cls.model_fields if k in entry})


class Ratio(BaseModel):
    """The median and quartiles of per-repetition ratios a_i / b_i, and a 95% bootstrap
    confidence interval of that median (repetitions resampled with replacement)."""

    median: float
    q1: float
    q3: float
    ci_low: float | None = None
    ci_high: float | None = None


#: bootstrap resamples of a median ratio (seeded: the same samples give the same interval)
BOOTSTRAP = 2000


def paired_ratio(a: Timing, b: Timing, *, ci: bool = False) -> Ratio:
    """a / b measured repetition by repetition: the median and quartiles of a_i / b_i over
    the repetitions of one interleaved run. On the H200 at its power cap the clock wanders
    by several percent over seconds, which widens each function's own spread (IQR / median
    up to 13% at 70B); a and b run a fraction of a second apart within one repetition, so
    the wander mostly cancels in their ratio while it stays in the ratio of their medians.
    ci: also the bootstrap interval of the median (BOOTSTRAP resamples, ~0.1 s)."""
    if not a.samples_us or len(a.samples_us) != len(b.samples_us):
        raise ValueError(f"paired_ratio needs the samples of one interleaved run (got {len(a.samples_us)} "
                         f"and {len(b.samples_us)})")
    if min(b.samples_us) <= 0:
        raise ValueError("paired_ratio: a repetition of the denominator took no time")
    ratios = [x / y for x, y in zip(a.samples_us, b.samples_us)]
    r = summarize(ratios)
    lo, hi = bootstrap_median_ci(ratios) if ci else (None, None)
    return Ratio(median=r.median_us, q1=r.q1_us, q3=r.q3_us, ci_low=lo, ci_high=hi)


def speed(t: Timing, reference: Timing | None) -> float:
    """How long t took, comparable with the other timings of its run: its median
    per-repetition ratio to `reference` (the clock's drift cancels), or its median time where
    either has no samples (result files from before samples were kept)."""
    if reference is not None and reference.samples_us and len(t.samples_us) == len(reference.samples_us):
        return paired_ratio(t, reference).median
    return t.median_us


def fastest(timings: dict[str, Timing], reference: Timing | None) -> str:
    """The name of the fastest of `timings` (one interleaved run), by speed() against
    `reference`: how the speed of light is picked among the plain GEMMs (cuBLAS the
    reference), in the evaluator and in lab/bench/ alike."""
    return min(timings, key=lambda name: speed(timings[name], reference))


def bootstrap_median_ci(values: Sequence[float], *, level: float = 0.95, resamples: int = BOOTSTRAP,
                        seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the median of `values` (one value: itself)."""
    import random

    vals = [float(v) for v in values]
    if len(vals) < 2:
        return vals[0], vals[0]
    rng = random.Random(seed)
    n = len(vals)
    medians = sorted(statistics.median(rng.choices(vals, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2
    return medians[int(tail * (resamples - 1))], medians[int((1 - tail) * (resamples - 1))]


def summarize(samples_us: Sequence[float], keep: bool = False, clocks: ClockSummary | None = None) -> Timing:
    """Median, quartiles (statistics.quantiles, 'exclusive' method), min and n of samples;
    keep: also the samples themselves, in the order given (to 0.01 us: CUDA events resolve
    about 0.5 us, cudaEventElapsedTime's documented resolution); clocks: the phase's."""
    given = [float(x) for x in samples_us]
    samples = sorted(given)
    if not samples:
        raise ValueError("no samples")
    if any(x != x or x < 0 for x in samples):
        raise ValueError("samples must be non-negative numbers")
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return Timing(median_us=statistics.median(samples), q1_us=q[0], q3_us=q[2], min_us=samples[0], n=len(samples),
                  samples_us=[round(x, 2) for x in given] if keep else [], clocks=clocks)
