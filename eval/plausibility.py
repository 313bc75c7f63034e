"""Plausibility: a timing faster than the roofline floor is quarantined, not ranked.

floor = max(flops / peak, bytes / bandwidth), with the task's GEMM flops (task.flops) and
the bytes it must move at least (task.min_bytes: each input read once, each output
written once). No honest kernel beats it; a kernel that does is skipping work, caching,
or fooling the timer.

The ceilings must be upper bounds, so they are the datasheet maxima, not typical measured
rates: with 790 TFLOP/s (a measured torch matmul rate) as the ceiling, the honest expert
k1 ran at 820 TFLOP/s on the H200 (412 GFLOP in 503 us) and was quarantined. Sources
(override with the environment variables, read by the worker before it imports a kernel):
  PEAK_BF16_TFLOPS = 989.4   H100/H200 SXM dense bf16 tensor-core peak (NVIDIA datasheet)
  COPY_BANDWIDTH_TBS = 4.8   H200 HBM3e bandwidth (NVIDIA datasheet; copies measure ~4.3)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PEAK_BF16_TFLOPS = 989.4
COPY_BANDWIDTH_TBS = 4.8
ENV_PEAK = "EPIFORGE_PEAK_TFLOPS"
ENV_BANDWIDTH = "EPIFORGE_BANDWIDTH_TBS"


@dataclass(frozen=True)
class Ceilings:
    peak_tflops: float = PEAK_BF16_TFLOPS
    bandwidth_tbs: float = COPY_BANDWIDTH_TBS

    @classmethod
    def from_env(cls, env=None) -> "Ceilings":
        env = os.environ if env is None else env
        return cls(float(env.get(ENV_PEAK, PEAK_BF16_TFLOPS)), float(env.get(ENV_BANDWIDTH, COPY_BANDWIDTH_TBS)))


def floor_us(flops: int, min_bytes: int, ceilings: Ceilings = Ceilings()) -> float:
    """The fastest any kernel can do this work, in microseconds."""
    if flops < 0 or min_bytes < 0:
        raise ValueError("flops and bytes must be non-negative")
    compute = flops / (ceilings.peak_tflops * 1e12)
    memory = min_bytes / (ceilings.bandwidth_tbs * 1e12)
    return max(compute, memory) * 1e6


def check(median_us: float, flops: int, min_bytes: int, ceilings: Ceilings = Ceilings()) -> tuple[bool, str, float]:
    """(plausible, one line, floor in us)."""
    floor = floor_us(flops, min_bytes, ceilings)
    if median_us < floor:
        return False, (f"{median_us:.2f} us is faster than the roofline floor {floor:.2f} us "
                       f"({flops / 1e9:.2f} GFLOP at {ceilings.peak_tflops:g} TFLOP/s, {min_bytes / 1e6:.2f} MB at "
                       f"{ceilings.bandwidth_tbs:g} TB/s): quarantined, not ranked"), floor
    return True, f"{median_us:.2f} us >= floor {floor:.2f} us ({median_us / floor:.2f}x)", floor
