"""Result: one evaluation of one kernel on one task's shape set on one machine."""

from __future__ import annotations

import datetime as _dt
from enum import Enum

from pydantic import BaseModel, Field

from tasks.tolerance import OutputCheck


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


class ShapeResult(BaseModel):
    """The checks (and, when timed, the timings) of one shape."""

    shape: str
    dims: dict[str, int]
    outcome: Outcome
    outputs: list[OutputCheck] = []
    message: str = ""
    # timings exist only when the kernel was timed (never for a failed check)
    timing: dict | None = None


class Result(BaseModel):
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
    outcome: Outcome
    message: str = Field("", description="one line: why it failed, or what passed")
    stderr_tail: str = ""
    per_shape: list[ShapeResult] = []
    compiled: list[dict] = Field([], description="sm_90a cross-compiles done on a CPU (epilogue, config, ok, seconds)")
    environment: dict = {}
    started_at: str = Field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    wall_s: float | None = None

    @property
    def passed(self) -> bool:
        return self.outcome == Outcome.PASSED
