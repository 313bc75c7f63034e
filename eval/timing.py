"""GPU timing, done one way everywhere (the evaluator and bench/ both use it).

CUDA events recorded on the stream the work runs on (the current stream), the L2 cache
flushed before every repetition (outside the timed region), warm-up runs first (compiles,
autotuning, allocator growth), inputs rotated across repetitions so no run reads what the
previous one left in cache, and the median of many repetitions with its spread.
"""

from __future__ import annotations

import statistics
from typing import Callable, Sequence

from pydantic import BaseModel

# the H200's L2 is 60 MB (H100: 50 MB); writing 4x that evicts it
_FLUSH_BYTES = 256 * 1024 * 1024
_flush_buf = None


class Timing(BaseModel):
    """Microseconds per call over n timed repetitions."""

    median_us: float
    q1_us: float
    q3_us: float
    min_us: float
    n: int

    @property
    def iqr_us(self) -> float:
        return self.q3_us - self.q1_us


def flush_l2() -> None:
    import torch

    global _flush_buf
    if _flush_buf is None:
        _flush_buf = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    _flush_buf.zero_()


def time_cuda_interleaved(
    fns: dict[str, tuple[Callable[..., object], Sequence[tuple]]],
    *,
    warmup: int = 3,
    reps: int = 50,
    flush: bool = True,
) -> dict[str, Timing]:
    """Time several functions against each other: each repetition runs every function once,
    in an order that rotates, so drift in clocks or temperature during the run falls on all
    of them alike (timing them one after another lets it bias the ratios)."""
    import torch

    names = list(fns)
    for name in names:
        fn, arg_sets = fns[name]
        for i in range(warmup):
            fn(*arg_sets[i % len(arg_sets)])
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    events = {n: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)] for n in names}
    for i in range(reps):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            fn, arg_sets = fns[name]
            if flush:
                flush_l2()
            start, end = events[name][i]
            start.record(stream)
            fn(*arg_sets[i % len(arg_sets)])
            end.record(stream)
    torch.cuda.synchronize()
    return {n: _summary([s.elapsed_time(e) * 1000.0 for s, e in events[n]]) for n in names}


def _summary(samples: list[float]) -> Timing:
    samples = sorted(samples)
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return Timing(median_us=statistics.median(samples), q1_us=q[0], q3_us=q[2], min_us=samples[0], n=len(samples))


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
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush:
            flush_l2()
        starts[i].record(stream)
        fn(*arg_sets[i % len(arg_sets)])
        ends[i].record(stream)
    torch.cuda.synchronize()
    return _summary([s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)])
