"""The GPU's clocks, power and temperature over a timed phase, read through NVML every ~10 ms
in a background thread (ClockSampler), summarized into a ClockSummary that the timings of
that phase carry (eval.stats.Timing.clocks).

Why: on the H200 at its power cap the SM clock wanders by several percent, and two harnesses
that time the same kernels (compare's judge, with idle gaps between repetitions, and
lab/bench/run.py, which queues them back to back) disagreed by up to 6% on the same ratios in one
session. The summary says which clocks each run saw.

NVML is reached through ctypes on libnvidia-ml.so.1 (the driver's own library; no pynvml).
Without it (a CPU machine, a driver without NVML, a device it cannot read) nothing fails:
the summary says that clocks are absent and why. Torch-free, like eval/stats.py.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import threading
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

NVML_LIBRARY = "libnvidia-ml.so.1"
#: seconds between two samples
INTERVAL_S = 0.01
_NVML_CLOCK_SM = 1
_NVML_TEMPERATURE_GPU = 0
#: clocks event (throttle) reasons, nvml.h: software power cap, hardware power brake
POWER_CAP_REASONS = 0x4 | 0x80
#: software and hardware thermal slowdown
THERMAL_REASONS = 0x20 | 0x40


class ClockSummary(BaseModel):
    """The GPU's clocks over one timed phase (every function timed in that phase shares it).
    Either `absent` says why nothing was sampled and every number is None, or `samples` > 0
    readings were taken and the SM clock's median, min and max are set; power, temperature and
    the reasons' shares are None where the device does not report them."""

    model_config = ConfigDict(extra="forbid")

    absent: str | None = Field(None, description="why no clock was sampled (no NVML library, no GPU, ...)")
    device: int | None = Field(None, description="the NVML index of the GPU sampled")
    samples: int = Field(0, ge=0, description="readings taken")
    interval_ms: float | None = Field(None, gt=0, description="the interval asked for between readings")
    sm_mhz_median: float | None = Field(None, gt=0, description="SM clock (NVML_CLOCK_SM), MHz")
    sm_mhz_min: float | None = Field(None, gt=0)
    sm_mhz_max: float | None = Field(None, gt=0)
    power_w_median: float | None = Field(None, ge=0, description="board power draw, W")
    temperature_c_max: float | None = Field(None, description="GPU temperature, degrees C, the highest read")
    power_capped_share: float | None = Field(None, ge=0, le=1, description="share of readings whose clocks "
                                             "event reasons include the power cap (software cap or hardware brake)")
    thermal_share: float | None = Field(None, ge=0, le=1, description="share of readings with a thermal slowdown")

    @model_validator(mode="after")
    def _sampled_or_absent(self) -> "ClockSummary":
        if self.absent is not None:
            if self.samples or self.sm_mhz_median is not None:
                raise ValueError("a clock summary that is absent holds no readings")
        elif not self.samples or None in (self.sm_mhz_median, self.sm_mhz_min, self.sm_mhz_max):
            raise ValueError("a clock summary holds readings (samples > 0, the SM clock) or says why it is absent")
        elif not self.sm_mhz_min <= self.sm_mhz_median <= self.sm_mhz_max:
            raise ValueError("the SM clock's min <= median <= max")
        return self

    @classmethod
    def missing(cls, why: str) -> "ClockSummary":
        return cls(absent=why)

    def line(self) -> str:
        """One line for a report: the SM clock and power, or why they are absent."""
        if self.absent:
            return f"clocks absent: {self.absent}"
        text = f"SM {self.sm_mhz_median:.0f} MHz ({self.sm_mhz_min:.0f}-{self.sm_mhz_max:.0f})"
        if self.power_w_median is not None:
            text += f", {self.power_w_median:.0f} W"
        if self.power_capped_share is not None:
            text += f", power-capped {self.power_capped_share:.0%}"
        return text + f" over {self.samples} readings"


class ClockReading(NamedTuple):
    """One NVML reading; None where the device did not answer that query."""

    sm_mhz: float
    power_mw: float | None
    temperature_c: float | None
    reasons: int | None


def summarize_readings(readings: list[ClockReading], *, device: int | None = None,
                       interval_s: float = INTERVAL_S) -> ClockSummary:
    """The ClockSummary of readings (at least one)."""
    if not readings:
        raise ValueError("no clock readings to summarize")
    sm = [r.sm_mhz for r in readings]
    power = [r.power_mw for r in readings if r.power_mw is not None]
    temps = [r.temperature_c for r in readings if r.temperature_c is not None]
    reasons = [r.reasons for r in readings if r.reasons is not None]
    return ClockSummary(
        device=device, samples=len(readings), interval_ms=interval_s * 1e3,
        sm_mhz_median=statistics.median(sm), sm_mhz_min=min(sm), sm_mhz_max=max(sm),
        power_w_median=statistics.median(power) / 1e3 if power else None,
        temperature_c_max=max(temps) if temps else None,
        power_capped_share=sum(bool(x & POWER_CAP_REASONS) for x in reasons) / len(reasons) if reasons else None,
        thermal_share=sum(bool(x & THERMAL_REASONS) for x in reasons) / len(reasons) if reasons else None)


class NvmlAbsent(Exception):
    """NVML cannot be used here; the message says why (one line)."""


_loaded: dict[str, ctypes.CDLL] = {}
_load_lock = threading.Lock()


def _nvml(library: str) -> ctypes.CDLL:
    """The NVML library, loaded and initialized once per process."""
    with _load_lock:
        if library in _loaded:
            return _loaded[library]
        try:
            lib = ctypes.CDLL(library)
        except OSError as e:
            raise NvmlAbsent(f"no NVML library: {e}") from None
        _check(lib, lib.nvmlInit_v2(), "nvmlInit_v2")
        _loaded[library] = lib
        return lib


def _check(lib: ctypes.CDLL, ret: int, what: str) -> None:
    if ret != 0:
        try:
            lib.nvmlErrorString.restype = ctypes.c_char_p
            why = lib.nvmlErrorString(ret).decode(errors="replace")
        except Exception:  # an old library without it
            why = f"error {ret}"
        raise NvmlAbsent(f"{what}: {why}")


class _Device:
    """NVML queries of one GPU; a query the device does not answer reads None from then on."""

    def __init__(self, library: str, index: int):
        self.lib = lib = _nvml(library)
        self.handle = ctypes.c_void_p()
        _check(lib, lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self.handle)),
               f"nvmlDeviceGetHandleByIndex_v2({index})")
        self.reasons_fn = next((getattr(lib, n) for n in ("nvmlDeviceGetCurrentClocksEventReasons",
                                                          "nvmlDeviceGetCurrentClocksThrottleReasons")
                                if hasattr(lib, n)), None)
        self.unanswered: set[str] = set()
        self.sm_mhz()  # raises NvmlAbsent if the SM clock cannot be read at all

    def _uint(self, name: str, fn, *args, kind=ctypes.c_uint):
        if name in self.unanswered:
            return None
        out = kind()
        if fn(self.handle, *args, ctypes.byref(out)) != 0:
            self.unanswered.add(name)
            return None
        return out.value

    def sm_mhz(self) -> float:
        out = ctypes.c_uint()
        _check(self.lib, self.lib.nvmlDeviceGetClockInfo(self.handle, ctypes.c_int(_NVML_CLOCK_SM), ctypes.byref(out)),
               "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)")
        return float(out.value)

    def read(self) -> ClockReading:
        reasons = (self._uint("reasons", self.reasons_fn, kind=ctypes.c_ulonglong)
                   if self.reasons_fn is not None else None)
        return ClockReading(self.sm_mhz(), self._uint("power", self.lib.nvmlDeviceGetPowerUsage),
                            self._uint("temperature", self.lib.nvmlDeviceGetTemperature,
                                       ctypes.c_int(_NVML_TEMPERATURE_GPU)),
                            reasons)


def nvml_index(cuda_index: int) -> int:
    """The NVML index of CUDA device cuda_index: NVML counts every GPU, CUDA only those
    CUDA_VISIBLE_DEVICES names (by index; a list of UUIDs is taken in NVML's order)."""
    visible = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    if cuda_index < len(visible) and visible[cuda_index].isdigit():
        return int(visible[cuda_index])
    return cuda_index


class ClockSampler:
    """Samples one GPU's clocks every interval_s in a background thread while the `with`
    block runs (a reading at its start and at its end too); summary() afterwards. Where NVML
    cannot be used the block runs the same and summary() says why clocks are absent; skip:
    sample nothing, for this reason (a phase timed on the host's clock)."""

    def __init__(self, device: int = 0, *, interval_s: float = INTERVAL_S, library: str = NVML_LIBRARY,
                 skip: str | None = None):
        self.device, self.interval_s, self.library = device, interval_s, library
        self.readings: list[ClockReading] = []
        self.absent: str | None = skip
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: _Device | None = None

    def _take(self) -> None:
        try:
            self.readings.append(self._nvml.read())
        except NvmlAbsent as e:  # the device stopped answering mid-phase: keep what was read
            self.absent = self.absent or str(e)
            self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def __enter__(self) -> "ClockSampler":
        if self.absent:
            return self
        try:
            self._nvml = _Device(self.library, self.device)
        except NvmlAbsent as e:
            self.absent = str(e)
            return self
        self._take()
        self._thread = threading.Thread(target=self._run, name="epiforge-clocks", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._take()
        self._thread = None

    def summary(self) -> ClockSummary:
        if not self.readings:
            return ClockSummary.missing(self.absent or "no reading was taken")
        return summarize_readings(self.readings, device=self.device, interval_s=self.interval_s)

