"""GPU timing, done one way everywhere (the evaluator and bench/ both use it).

CUDA events recorded on the stream the work runs on (the current stream), the L2 cache
flushed before every repetition (outside the timed region), warm-up runs first (compiles,
autotuning, allocator growth), inputs rotated across repetitions so no run reads what the
previous one left in cache, and the median of many repetitions with its spread. Before
each repetition the GPU is also given a short spin (outside the timed region) so that the
host has queued the timed work before the GPU reaches it: the events then time the GPU's
work, not the host's launch overhead (Python wrappers of ~10-100 us would otherwise leave
the GPU idle inside the timed region for short kernels, and unevenly so between a fused
kernel and cuBLAS).
"""

from __future__ import annotations

import statistics
from typing import Callable, Sequence

from pydantic import BaseModel, Field

# the H200's L2 is 60 MB (H100: 50 MB); writing 4x that evicts it
_FLUSH_BYTES = 256 * 1024 * 1024
_flush_buf = None
# ~100 us at the H200's 1.98 GHz boost clock, ~140 us at the ~1.45 GHz it holds at its power cap
_LEAD_CYCLES = 200_000
# timed_call starts from an idle host (it synchronizes after every call), so its spin must
# outlast a whole run()'s host work (a quack launch's Python, ~0.5-1 ms): ~1.5-2 ms
_SYNCED_LEAD_CYCLES = 3_000_000


def _bind():
    """The timer's own references to the CUDA event API, taken when this module is
    imported (before any kernel is): a kernel that patches torch.cuda.Event or its
    elapsed_time afterwards does not change what the timer reads."""
    try:
        import torch

        return torch.cuda.Event, torch.cuda.Event.elapsed_time, torch.cuda.synchronize
    except Exception:  # no torch.cuda at all
        return None, None, None


_EVENT, _ELAPSED, _SYNC = _bind()


class Timing(BaseModel):
    """Microseconds per call over n timed repetitions. samples_us: each repetition's time in
    repetition order (time_cuda_interleaved: sample i of every function comes from the same
    repetition, a fraction of a second apart), so that two functions can be compared
    repetition by repetition (paired_ratio)."""

    median_us: float
    q1_us: float
    q3_us: float
    min_us: float
    n: int
    samples_us: list[float] = Field(default_factory=list)

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


def flush_l2() -> None:
    import torch

    global _flush_buf
    if _flush_buf is None:
        _flush_buf = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    _flush_buf.zero_()


def _prepare_rep(flush: bool, lead_cycles: int = _LEAD_CYCLES) -> None:
    """Before a timed repetition: evict L2, then queue a spin so the host runs ahead."""
    import torch

    if flush:
        flush_l2()
    torch.cuda._sleep(lead_cycles)


def timed_call(fn: Callable[[], object], *, flush: bool = True, clock: str = "cuda") -> float:
    """One timed call on the current stream, synchronized: L2 flushed and the spin queued
    first (outside the events), CUDA events around fn(). Returns microseconds. The judge
    times its baselines and the kernel runner times the kernel with this same procedure.
    clock="wall": the same call timed by the host's clock, no CUDA (the timed stages run
    this way on a CPU in the evaluator's own tests; no CPU time is ever reported)."""
    import time

    import torch

    if clock == "wall":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    _prepare_rep(flush, lead_cycles=_SYNCED_LEAD_CYCLES)
    start, end = _EVENT(enable_timing=True), _EVENT(enable_timing=True)
    stream = torch.cuda.current_stream()
    start.record(stream)
    fn()
    end.record(stream)
    _SYNC()
    return _ELAPSED(start, end) * 1000.0


def time_cuda_interleaved(
    fns: dict[str, tuple[Callable[..., object], Sequence[tuple]]],
    *,
    warmup: int = 3,
    reps: int = 50,
    flush: bool = True,
) -> dict[str, Timing]:
    """Time several functions against each other: each repetition runs every function once,
    in a fresh random order (seeded: reproducible), so drift in clocks, temperature or power
    during the run falls on all of them alike (timing them one after another lets it bias
    the ratios), and no function always follows the same neighbour (at the power cap a
    kernel inherits the clock its predecessor left: with a merely rotating order the same
    plain GEMM, timed twice in one run, differed by up to 20% on the H200)."""
    import random

    import torch

    names = list(fns)
    order = random.Random(len(names) * 7919 + reps)  # the seed the committed H200 results ran with
    for name in names:
        fn, arg_sets = fns[name]
        for i in range(warmup):
            fn(*arg_sets[i % len(arg_sets)])
    _SYNC()
    stream = torch.cuda.current_stream()
    events = {n: [(_EVENT(enable_timing=True), _EVENT(enable_timing=True)) for _ in range(reps)] for n in names}
    for i in range(reps):
        for name in order.sample(names, len(names)):
            fn, arg_sets = fns[name]
            _prepare_rep(flush)
            start, end = events[name][i]
            start.record(stream)
            fn(*arg_sets[i % len(arg_sets)])
            end.record(stream)
    _SYNC()
    return {n: summarize([_ELAPSED(s, e) * 1000.0 for s, e in events[n]], keep=True) for n in names}


def summarize(samples_us: Sequence[float], keep: bool = False) -> Timing:
    """Median, quartiles (statistics.quantiles, 'exclusive' method), min and n of samples;
    keep: also the samples themselves, in the order given (to 0.01 us: CUDA events resolve
    about 0.5 us, cudaEventElapsedTime's documented resolution)."""
    given = [float(x) for x in samples_us]
    samples = sorted(given)
    if not samples:
        raise ValueError("no samples")
    if any(x != x or x < 0 for x in samples):
        raise ValueError("samples must be non-negative numbers")
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return Timing(median_us=statistics.median(samples), q1_us=q[0], q3_us=q[2], min_us=samples[0], n=len(samples),
                  samples_us=[round(x, 2) for x in given] if keep else [])


def time_cuda(
    fn: Callable[..., object],
    arg_sets: Sequence[tuple],
    *,
    warmup: int = 5,
    reps: int = 50,
    flush: bool = True,
) -> Timing:
    """Time fn(*args) with args rotating through arg_sets."""
    import torch

    if not arg_sets:
        raise ValueError("time_cuda needs at least one argument set")
    for i in range(warmup):
        fn(*arg_sets[i % len(arg_sets)])
    _SYNC()
    stream = torch.cuda.current_stream()
    starts = [_EVENT(enable_timing=True) for _ in range(reps)]
    ends = [_EVENT(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        _prepare_rep(flush)
        starts[i].record(stream)
        fn(*arg_sets[i % len(arg_sets)])
        ends[i].record(stream)
    _SYNC()
    return summarize([_ELAPSED(s, e) * 1000.0 for s, e in zip(starts, ends)])
