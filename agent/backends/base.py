"""What every backend is: `complete(system, messages, tools, step)` -> ModelTurn.

Backends speak their own wire format; the loop sees only session.Message/Block values.
Failures are BackendError with one clear line; transient API failures (429, 5xx,
overloaded, timeouts, dropped connections) are retried here with exponential backoff,
each retry reported to the loop (which logs it). The loop passes `time_left` (seconds the
session's wall-time budget has left, None: no limit): a retry that would wait longer than
that is not made (WallTimeExhausted, which ends the session as budget_exhausted), and no
single request is allowed longer than it.
"""

from __future__ import annotations

import random
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

from epiforge.agent.session import Block, Message, Usage


class BackendError(RuntimeError):
    """A backend that cannot go on (one line: which backend, what happened)."""


class RecordingExhausted(BackendError):
    """A replay asked for a response the recording does not have."""


class WallTimeExhausted(Exception):
    """The session's wall-time budget has no room for another request or the wait before a
    retry (one line, naming the wall-time budget). Not a BackendError: the session ends as
    budget_exhausted, not backend_error."""


@dataclass
class ModelTurn:
    content: list[Block]
    stop_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    latency_s: float = 0.0
    model: str | None = None
    source: str = "live"
    cost_usd: float | None = None
    notes: dict = field(default_factory=dict)

    @property
    def tool_calls(self) -> list:
        return [b for b in self.content if b.type == "tool_use"]


@dataclass
class ToolSpec:
    name: str
    description: str
    input_schema: dict


@dataclass
class SessionContext:
    """What a backend may need to know about the session before its first turn."""

    session_id: str
    task: object  # tasks.Task
    pack: object  # agent.pack.Pack
    workspace: object  # pathlib.Path holding kernel.py
    system: str
    prompt: str
    config: object  # agent.session.SessionConfig


RetryHook = Callable[[int, str, float], None]  # (attempt, error line, wait seconds)
TimeLeft = Callable[[], "float | None"]  # seconds the session's wall-time budget has left (None: no limit)


class Backend:
    """Base: subclasses set `name` and implement complete()."""

    name = "base"

    def __init__(self, model: str):
        self.model = model
        self.reached = False  # has the server answered once (see with_retries)

    def start(self, ctx: SessionContext) -> None:
        """Called once before the first turn (the command backend prepares its workspace)."""

    def complete(self, system: str, messages: list[Message], tools: list[ToolSpec], *, step: int,
                 on_retry: RetryHook | None = None, time_left: TimeLeft | None = None) -> ModelTurn:
        """One model turn. `time_left`: see with_retries (a backend may ignore it)."""
        raise NotImplementedError

    def info(self) -> dict:
        """What the session log records about this backend (no secrets)."""
        return {"backend": self.name, "model": self.model}

    def ended(self, outcome: str, reason: str) -> None:
        """Called once when the session ends (SessionEnded's outcome and reason): a backend
        whose agent waits on files (command) tells it there."""

    def close(self) -> None:
        pass


@dataclass
class RetryPolicy:
    """How transient API failures are retried: up to `max_retries` times, waiting
    backoff_s * 2**attempt (capped at max_wait_s) with jitter, or what the server's
    retry-after asks for (up to max_retry_after_s). The default rides out an outage of
    2 to 4 minutes (half to all of 1 + 2 + 4 + ... + 60 + 60 + 60 s); a longer one ends the
    session as backend_error, which --resume continues."""

    max_retries: int = 9
    backoff_s: float = 1.0
    max_wait_s: float = 60.0
    max_retry_after_s: float = 600.0

    def wait_s(self, attempt: int, suggested: float | None) -> float:
        """Seconds before retry number `attempt + 1`: never less than the server asked for,
        otherwise exponential with "equal jitter" (half fixed, half random) so that many
        clients do not retry in step."""
        if suggested is not None:
            return min(self.max_retry_after_s, suggested) * (1 + 0.1 * random.random())
        wait = min(self.max_wait_s, self.backoff_s * 2**attempt)
        return wait / 2 + random.random() * wait / 2


def with_retries(call: Callable[[float | None], ModelTurn], classify: Callable[[Exception], tuple[bool, str, float | None]],
                 policy: RetryPolicy, on_retry: RetryHook | None, *, reached: bool = True,
                 time_left: TimeLeft | None = None) -> ModelTurn:
    """Run `call(seconds)`; on an exception `classify` says (retryable, one-line description,
    server-suggested wait). Retryable failures are retried as `policy` says. Until the
    server has answered once (`reached` False), a refused connection is not retried: it is
    a wrong URL or a server that is not running, and the user should hear so at once.

    `time_left()`: seconds the session's wall-time budget has left (None: no limit). Each
    attempt gets it as `seconds`, the most its request may take (None: the client's timeout);
    an attempt with no time left, or a retry whose wait is longer than the time left, raises
    WallTimeExhausted instead of being made."""
    attempt, line = 0, None
    while True:
        left = time_left() if time_left else None
        if left is not None and left <= 0:
            after = f" after {line}" if line else ""
            raise WallTimeExhausted(f"wall-time budget: no time left for another request{after}")
        try:
            return call(left)
        except BackendError:
            raise
        except Exception as e:  # the SDK's errors, classified below
            retryable, line, suggested = classify(e)
            if not reached and _refused(e):
                raise BackendError(line) from None
            if not retryable or attempt >= policy.max_retries:
                tries = f" (after {attempt + 1} attempts)" if attempt else ""
                raise BackendError(line + tries) from None
            wait = policy.wait_s(attempt, suggested)
            left = time_left() if time_left else None
            if left is not None and left < wait:
                raise WallTimeExhausted(f"wall-time budget: {max(left, 0.0):.1f} s left, less than the {wait:.1f} s "
                                        f"wait before retry {attempt + 1} ({line})") from None
            attempt += 1
            if on_retry:
                on_retry(attempt, line, round(wait, 3))
            time.sleep(wait)


def request_timeout(timeout_s: float, left: float | None) -> float:
    """A request's timeout: the backend's, or the wall time left when that is shorter."""
    return timeout_s if left is None else max(0.001, min(timeout_s, left))


def _refused(e: BaseException) -> bool:
    """The connection itself failed (refused, unknown host), as opposed to a timeout or an HTTP error."""
    seen = 0
    while e is not None and seen < 20:
        if isinstance(e, (ConnectionRefusedError, socket.gaierror)):
            return True
        text = str(e)
        if "Connection refused" in text or "Name or service not known" in text or "nodename nor servname" in text:
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def retry_after(headers) -> float | None:
    """Seconds from a retry-after(-ms) header, if the server sent one."""
    if headers is None:
        return None
    for key, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(key)
        if value is not None:
            try:
                return max(0.0, float(value) * scale)
            except ValueError:
                return None
    return None


def root_cause(e: BaseException) -> str:
    """The innermost cause's first line (e.g. 'Connection refused' under an SDK's wrapper)."""
    while e.__cause__ is not None:
        e = e.__cause__
    return str(e).splitlines()[0] if str(e) else type(e).__name__
