"""Rebuild a session's state from its log: the conversation as the model saw it, the kernel
in its workspace, what was spent. Used to resume a killed session from its log.

Per step k the log holds: model_request, model_response (assistant content), then for each
tool call tool_called/tool_result (and evaluation events), then harness_note events; the
next user message is step k's tool results followed by its notes.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from dataclasses import dataclass, field

from epiforge.agent.session import (
    BestKernel, Evaluation, HarnessNote, Message, ModelResponse, SessionConfig, SessionEnded, SessionResumed,
    SessionStarted, TextBlock, ToolResult, ToolResultBlock, ToolUseBlock, Totals,
)
from epiforge.agent.tools import update_best


@dataclass
class Rebuilt:
    start: SessionStarted
    messages: list[Message]
    next_step: int
    totals: Totals
    sources: dict[str, str] = field(default_factory=dict)
    current: str | None = None
    best: BestKernel | None = None
    pending: list[ToolUseBlock] = field(default_factory=list)  # calls of the last response with no result yet
    partial: list[ToolResultBlock] = field(default_factory=list)  # the results it has (they go first in its message)
    idle: int = 0  # consecutive responses without tool calls at the end
    ended: SessionEnded | None = None  # how the session ended, unless it was resumed after that
    config: SessionConfig | None = None  # the latest configuration: the start's, or the last resume's


def rebuild(events: list) -> Rebuilt:
    start = events[0]
    responses: dict[int, ModelResponse] = {}
    results: dict[int, list[ToolResult]] = {}
    notes: dict[int, list[HarnessNote]] = {}
    evaluations: list[Evaluation] = []
    ended, config = None, start.config
    for e in events:
        if isinstance(e, ModelResponse):
            responses[e.step] = e  # a step re-asked after a kill keeps its last answer
            results[e.step], notes[e.step] = [], []
        elif isinstance(e, ToolResult) and e.step in results:
            results[e.step].append(e)
        elif isinstance(e, HarnessNote) and e.step in notes:
            notes[e.step].append(e)
        elif isinstance(e, Evaluation):
            evaluations.append(e)
        elif isinstance(e, SessionEnded):
            ended = e
        elif isinstance(e, SessionResumed):
            ended, config = None, e.config or config
    out = Rebuilt(start=start, messages=[Message(role="user", content=[TextBlock(text=start.prompt)])],
                  next_step=0, totals=Totals(), ended=ended, config=config)
    for step in sorted(responses):
        r = responses[step]
        out.messages.append(Message(role="assistant", content=r.content or [TextBlock(text="(empty response)")]))
        calls = [b for b in r.content if b.type == "tool_use"]
        done = {t.call_id: t for t in results[step]}
        for call in calls:
            if call.name == "write_kernel" and call.id in done and isinstance(call.input.get("source"), str):
                source = call.input["source"]
                sha = hashlib.sha256(source.encode()).hexdigest()
                out.sources[sha], out.current = source, sha
        out.pending = [c for c in calls if c.id not in done]
        out.idle = 0 if calls else out.idle + 1
        blocks = [ToolResultBlock(tool_use_id=c.id, content=done[c.id].content, is_error=done[c.id].is_error)
                  for c in calls if c.id in done]
        blocks += [TextBlock(text=n.text) for n in notes[step]]
        if out.pending:  # killed mid-step: the resumed run completes this message
            out.partial = blocks
        elif blocks:
            out.messages.append(Message(role="user", content=blocks))
        out.next_step = step + 1
        out.totals.turns += 1
        out.totals.usage = out.totals.usage + r.usage
        if r.cost_usd is not None:
            out.totals.cost_usd = round((out.totals.cost_usd or 0.0) + r.cost_usd, 6)
    out.totals.evaluations = sum(1 for e in evaluations if e.reused_from_step is None)
    out.totals.wall_s = _span_s(events)
    for e in evaluations:
        out.best = update_best(out.best, e.step, e.kernel_sha256, e.outcome, e.speed_ratio)
    return out


def _span_s(events: list) -> float:
    """The time the session ran: from each start or resume to the last event before the next
    resume (the hours a killed or failed session waited are not its wall time), and the
    pack's screening before each start or resume."""
    def t(e):
        return _dt.datetime.fromisoformat(e.t)

    total, first, last = events[0].screen_s, events[0], events[0]
    for e in events[1:]:
        if isinstance(e, SessionResumed):
            total += (t(last) - t(first)).total_seconds() + e.screen_s
            first = e
        last = e
    return round(total + (t(last) - t(first)).total_seconds(), 3)
