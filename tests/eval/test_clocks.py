"""eval/clocks.py: the NVML clock sampler's summary, its absence where NVML cannot be used
(a CPU machine), and on the H200 a plausible SM clock while a matmul loop runs."""

import pytest
from pydantic import ValidationError

from epiforge.eval.clocks import ClockReading, ClockSampler, ClockSummary, nvml_index, summarize_readings
from epiforge.eval.stats import Timing, summarize


def test_the_summary_takes_median_min_max_and_the_shares_of_throttle_reasons():
    readings = [ClockReading(1500.0, 600_000.0, 60.0, 0x4),       # software power cap
                ClockReading(1980.0, 700_000.0, 64.0, 0x0),
                ClockReading(1700.0, 650_000.0, 71.0, 0x80),      # hardware power brake
                ClockReading(1600.0, None, None, 0x20 | 0x4)]     # thermal slowdown and power cap
    s = summarize_readings(readings, device=3, interval_s=0.01)
    assert (s.samples, s.device, s.interval_ms) == (4, 3, 10.0)
    assert (s.sm_mhz_median, s.sm_mhz_min, s.sm_mhz_max) == (1650.0, 1500.0, 1980.0)
    assert s.power_w_median == 650.0 and s.temperature_c_max == 71.0  # over the readings that have them
    assert s.power_capped_share == 0.75 and s.thermal_share == 0.25
    assert s.absent is None and "SM 1650 MHz (1500-1980), 650 W, power-capped 75%" in s.line()


def test_readings_without_power_or_reasons_leave_those_fields_empty():
    s = summarize_readings([ClockReading(1200.0, None, None, None), ClockReading(1300.0, None, None, None)])
    assert s.sm_mhz_median == 1250.0 and s.power_w_median is None and s.power_capped_share is None
    with pytest.raises(ValueError):
        summarize_readings([])


def test_a_summary_is_either_readings_or_a_reason():
    with pytest.raises(ValidationError):
        ClockSummary()  # neither
    with pytest.raises(ValidationError):
        ClockSummary(absent="no NVML", samples=3, sm_mhz_median=1000, sm_mhz_min=900, sm_mhz_max=1100)  # both
    with pytest.raises(ValidationError):
        ClockSummary(samples=3, sm_mhz_median=800, sm_mhz_min=900, sm_mhz_max=1100)  # median below min


def test_without_nvml_the_block_runs_and_the_summary_says_why():
    ran = []
    with ClockSampler(library="libepiforge-no-such-nvml.so.1") as s:
        ran.append(True)
    summary = s.summary()
    assert ran and summary.samples == 0 and summary.sm_mhz_median is None
    assert "no NVML library" in summary.absent and "libepiforge-no-such-nvml.so.1" in summary.absent
    assert summary.line().startswith("clocks absent: no NVML library")
    with ClockSampler(skip="timed on the host's clock") as s:
        pass
    assert s.summary().absent == "timed on the host's clock"


def test_a_timing_carries_the_summary_and_older_timings_load_without_one():
    absent = ClockSummary.missing("no GPU")
    t = summarize([3.0, 1.0, 2.0], keep=True, clocks=absent)
    again = Timing.model_validate_json(t.model_dump_json())
    assert again.clocks.absent == "no GPU" and again.samples_us == [3.0, 1.0, 2.0]
    old = Timing.of({"median_us": 2.0, "q1_us": 1.0, "q3_us": 3.0, "min_us": 1.0, "n": 3, "note": "a diagnostic"})
    assert old.clocks is None


def test_nvml_counts_the_gpus_cuda_visible_devices_names(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,2")
    assert (nvml_index(0), nvml_index(1)) == (5, 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml_index(1) == 1


@pytest.mark.gpu
def test_the_sm_clock_is_plausible_while_a_matmul_loop_runs():
    import torch

    from epiforge.eval.timing import gpu_clocks, time_cuda_interleaved

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with gpu_clocks() as clocks:
        for _ in range(100):  # ~0.15 s at the H200's ~790 TFLOP/s, queued back to back
            a @ a
        torch.cuda.synchronize()
    s = clocks.summary()
    assert s.absent is None, s.absent
    assert s.samples >= 5 and s.sm_mhz_median > 500 and s.sm_mhz_max < 3000
    assert s.power_w_median is None or s.power_w_median > 50  # a GPU at work draws more than idle
    timed = time_cuda_interleaved({"mm": (lambda x: x @ x, [(a,)]), "add": (lambda x: x + x, [(a,)])}, reps=10)
    assert timed["mm"].clocks == timed["add"].clocks and timed["mm"].clocks.sm_mhz_median > 500
