"""Session logs: the events of one agent session, defined once, and their JSONL file.

A log is append-only: one pydantic-validated event a line, each flushed and fsynced as it
is written, so a killed session loses at most the line being written and can resume from
what is on disk. Readers tolerate a truncated last line (with a warning); any other bad
line is one clear error naming the file and the line.

Conversation blocks (text, tool_use, tool_result) are Anthropic-shaped and backend-neutral:
each backend converts them to its own wire format.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def new_session_id(task_id: str) -> str:
    """Sortable, readable and unique: 20261130T181500Z-k8-3f9a2c (also the generated kernel's file name)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{task_id}-{secrets.token_hex(3)}"


class LogError(ValueError):
    """A session log that cannot be used (one line: file, line, why)."""


class ConfigError(ValueError):
    """A session configuration that cannot run (one line: which setting, why)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- conversation blocks ------------------------------------------------------------------


class TextBlock(_Model):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(_Model):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any] = {}


class ToolResultBlock(_Model):
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str
    is_error: bool = False


Block = Annotated[Union[TextBlock, ToolUseBlock, ToolResultBlock], Field(discriminator="type")]


class Message(_Model):
    role: Literal["user", "assistant"]
    content: list[Block]


# ---- what a session is configured with ----------------------------------------------------


class Budget(_Model):
    """When to stop: whichever limit is reached first (None: no limit of that kind)."""

    max_turns: int = Field(30, description="model responses")
    max_tokens: int | None = Field(None, description="input + output tokens over the session")
    max_usd: float | None = Field(None, description="dollars over the session (priced models only)")
    max_wall_s: float | None = Field(None, description="wall-clock seconds")

    def problem(self) -> str | None:
        """Why these limits cannot run, in one line (flag names, as the CLI spells them), or None."""
        if self.max_turns < 1:
            return f"--max-turns must be at least 1 (got {self.max_turns})"
        if self.max_tokens is not None and self.max_tokens < 1:
            return f"--max-tokens must be at least 1 (got {self.max_tokens})"
        if self.max_usd is not None and not self.max_usd > 0:
            return f"--budget-usd must be more than 0 dollars (got {self.max_usd:g})"
        if self.max_wall_s is not None and not self.max_wall_s > 0:
            return f"--max-wall-s must be more than 0 seconds (got {self.max_wall_s:g})"
        return None


class SessionConfig(_Model):
    task: str
    backend: str
    model: str
    base_url: str | None = None
    budget: Budget = Budget()
    compile: bool = Field(True, description="cross-compile every epilogue for sm_90a in checks on a CPU")
    device: Literal["auto", "cpu"] = Field("auto", description="auto: also use the GPU when there is one")
    speed_target: float = Field(1.05, description="kernel time / GEMM-only time a submitted kernel must reach (GPU only)")
    pack_without: list[str] = []
    max_output_tokens: int = 8192
    command: str | None = Field(None, description="the command backend's agent command line")
    sandbox: bool | None = Field(None, description="the command backend: whether its agent ran in agent/sandbox.py's "
                                 "sandbox (False: --no-sandbox); None for the API backends, which run nothing")
    sandbox_expose: list[str] = Field([], description="paths the sandbox kept visible, read-only (--sandbox-expose)")
    price_in: float | None = Field(None, description="USD per million input tokens, instead of agent/pricing.py's table")
    price_out: float | None = Field(None, description="USD per million output tokens, instead of the table")


class Usage(_Model):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(**{k: getattr(self, k) + getattr(other, k) for k in Usage.model_fields})

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens


class PackInfo(_Model):
    sha256: str
    docs: dict[str, str] = Field(description="page name -> sha256 of its text (12 hex)")
    in_prompt: list[str] = []
    examples: list[str] = Field([], description="expert kernels of other tasks offered")
    without: list[str] = []
    withheld: list[str] = Field([], description="pages left out because they name this task")
    withheld_code: list[dict] = Field([], description="code blocks and examples withheld because, adapted to "
                                      "this task, they pass its check: {where, why} (agent/screen.py)")
    unscreened: str | None = Field(None, description="why the screening stopped short (the wall-time budget); "
                                   "what it had not screened is withheld too")


class Totals(_Model):
    turns: int = 0
    usage: Usage = Usage()
    cost_usd: float | None = None
    wall_s: float = 0.0
    evaluations: int = 0


class BestKernel(_Model):
    step: int
    sha256: str
    outcome: str
    speed_ratio: float | None = None


# ---- events ---------------------------------------------------------------------------


class _Event(_Model):
    t: str = Field(default_factory=now_iso)
    session: str


class SessionStarted(_Event):
    event: Literal["session_started"] = "session_started"
    config: SessionConfig
    pack: PackInfo
    system_sha256: str
    prompt: str = Field(description="the first user message, in full")
    environment: dict = {}
    backend_info: dict = {}
    forked_from: dict | None = Field(None, description="{log, session, step} when this session continues another")
    replay_of: dict | None = Field(None, description="{log, session} when this session replays another")
    screen_s: float = Field(0.0, description="seconds the pack's screening took before this event (agent/screen.py), "
                                             "counted in the session's wall time")


class SessionResumed(_Event):
    event: Literal["session_resumed"] = "session_resumed"
    from_step: int
    pack_sha256: str
    skipped_line: int | None = Field(None, description="a truncated line left by the killed run (kept, never rewritten)")
    after_outcome: str | None = Field(None, description="the outcome the session had ended with (backend_error), if any")
    config: SessionConfig | None = Field(None, description="the configuration from here on (flags and environment "
                                                           "of the resume over what the log recorded)")
    screen_s: float = Field(0.0, description="seconds the pack's screening took before this event, counted in the "
                                             "session's wall time")


class ModelRequest(_Event):
    event: Literal["model_request"] = "model_request"
    step: int
    n_messages: int
    chars: int


class ApiRetry(_Event):
    event: Literal["api_retry"] = "api_retry"
    step: int
    attempt: int
    error: str
    wait_s: float


class ModelResponse(_Event):
    event: Literal["model_response"] = "model_response"
    step: int
    content: list[Block]
    stop_reason: str | None = None
    usage: Usage = Usage()
    cost_usd: float | None = None
    latency_s: float = 0.0
    model: str | None = None
    source: Literal["live", "replay"] = "live"
    notes: dict = Field({}, description="backend extras, e.g. a command's exit code and output tail")


class ToolCalled(_Event):
    event: Literal["tool_called"] = "tool_called"
    step: int
    call_id: str
    name: str
    input: dict[str, Any] = {}


class ToolResult(_Event):
    event: Literal["tool_result"] = "tool_result"
    step: int
    call_id: str
    name: str
    is_error: bool = False
    content: str
    seconds: float = 0.0


class Evaluation(_Event):
    event: Literal["evaluation"] = "evaluation"
    step: int
    call_id: str
    purpose: Literal["check", "benchmark", "submit"]
    kernel_sha256: str
    device: str
    shapes: str
    compile: bool
    seed: int | None = Field(None, description="the inputs' seed; none when the static stage stopped the kernel (nothing ran)")
    outcome: str
    message: str
    reused_from_step: int | None = None
    speed_ratio: float | None = None
    result: dict = Field({}, description="eval.result.Result, paths scrubbed")


class HarnessNote(_Event):
    event: Literal["harness_note"] = "harness_note"
    step: int
    text: str = Field(description="sent to the model after this step's tool results")


class SessionEnded(_Event):
    event: Literal["session_ended"] = "session_ended"
    outcome: Literal["passed", "passed_slow", "budget_exhausted", "gave_up", "backend_error", "recording_exhausted"]
    reason: str
    best: BestKernel | None = None
    generated_kernel: str | None = None
    totals: Totals = Totals()


Event = Annotated[
    Union[SessionStarted, SessionResumed, ModelRequest, ApiRetry, ModelResponse, ToolCalled, ToolResult,
          Evaluation, HarnessNote, SessionEnded],
    Field(discriminator="event"),
]
_EVENT = TypeAdapter(Event)


# ---- the file -------------------------------------------------------------------------


class SessionLog:
    """Append-only writer. `create` refuses an existing file; `append_to` continues one
    (a resumed session). Every event is validated, written whole, flushed and fsynced."""

    def __init__(self, path: Path, handle):
        self.path = path
        self._f = handle

    @classmethod
    def create(cls, path: Path) -> "SessionLog":
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except FileExistsError:
            raise LogError(f"{path}: already exists; a log is never overwritten") from None
        return cls(path, os.fdopen(fd, "a", encoding="utf-8"))

    @classmethod
    def append_to(cls, path: Path) -> "SessionLog":
        path = Path(path)
        handle = open(path, "a", encoding="utf-8")
        log = cls(path, handle)
        if path.stat().st_size and not _ends_with_newline(path):
            # a killed writer left half a line: end it so the next event starts on its own line
            log._write_raw("\n")
        return log

    def write(self, event) -> None:
        _EVENT.validate_python(event.model_dump())  # one schema for writers and readers
        self._write_raw(event.model_dump_json(exclude_none=True) + "\n")

    def _write_raw(self, text: str) -> None:
        self._f.write(text)
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def read_events(path: Path) -> tuple[list, list[str]]:
    """All events of a log, plus warnings. A bad last line is a warning (a writer was
    killed mid-line); so is a bad line that a later session_resumed event names as skipped.
    Any other bad line raises LogError."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise LogError(f"{path}: cannot read: {e.strerror}") from None
    lines = raw.decode("utf-8", errors="replace").split("\n")
    complete_last = lines[-1] == ""
    if complete_last:
        lines = lines[:-1]
    events, bad, warnings = [], [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            events.append((number, _EVENT.validate_python(json.loads(line))))
        except (json.JSONDecodeError, ValidationError) as e:
            bad.append((number, _first_line(e)))
    skipped = {e.skipped_line for _, e in events if isinstance(e, SessionResumed) and e.skipped_line}
    for number, why in bad:
        if number == len(lines) or number in skipped:
            warnings.append(f"{path}:{number}: ignored a truncated line ({why})")
        else:
            raise LogError(f"{path}:{number}: not a valid session event: {why}")
    if not events:
        raise LogError(f"{path}: holds no session events")
    if not isinstance(events[0][1], SessionStarted):
        raise LogError(f"{path}:{events[0][0]}: the first event must be session_started")
    return [e for _, e in events], warnings


def truncated_last_line(path: Path) -> int | None:
    """The number of the last line when it is not a valid event (what a resume must skip)."""
    lines = Path(path).read_text(encoding="utf-8", errors="replace").split("\n")
    if lines[-1] == "":
        lines = lines[:-1]
    if not lines:
        return None
    try:
        _EVENT.validate_python(json.loads(lines[-1]))
        return None
    except (json.JSONDecodeError, ValidationError):
        return len(lines)


def _first_line(e: Exception) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        return f"{'.'.join(str(x) for x in err['loc']) or 'event'}: {err['msg']}"
    return str(e).splitlines()[0]
