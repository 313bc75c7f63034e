"""Replay a recorded session offline, and fork one into a live backend.

Replay drives the loop with the recorded responses (no network) but runs every tool for
real: each kernel is re-evaluated on this machine, and the report lists where the new
results diverge from the recorded ones. A fork replays steps < N the same way, then hands
the conversation to a live backend from step N on. Both write a new log; the recording
is only read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from epiforge.agent.backends.replay_backend import ForkBackend, ReplayBackend
from epiforge.agent.loop import run_session
from epiforge.agent.session import Evaluation, LogError, ModelResponse, SessionEnded, ToolResult, read_events


@dataclass
class Divergence:
    step: int
    what: str  # e.g. "run_check (cpu, smoke)" or "read_doc"
    recorded: str
    replayed: str
    recorded_text: str = ""  # for a tool result: the first line of each answer, so the line says why
    replayed_text: str = ""

    def line(self) -> str:
        def answer(state, text):
            return f"{state} ({text!r})" if text else state

        return (f"step {self.step}: {self.what}: recorded {answer(self.recorded, self.recorded_text)}, "
                f"now {answer(self.replayed, self.replayed_text)}")


@dataclass
class ReplayReport:
    log: Path  # the recording
    session: str  # the recorded session's id
    new_log: Path
    new_session: str
    recorded_outcome: str | None
    outcome: str
    steps: int
    divergences: list[Divergence] = field(default_factory=list)  # evaluations whose verdict changed
    differences: list[Divergence] = field(default_factory=list)  # other tool results (e.g. a page now missing)
    warnings: list[str] = field(default_factory=list)
    fork_at: int | None = None

    @property
    def reproduced(self) -> bool:
        """The replay ended as the recording did, every kernel with the recorded verdict."""
        return self.recorded_outcome == self.outcome and not self.divergences

    def to_json(self) -> dict:
        return {"log": str(self.log), "session": self.session, "new_log": str(self.new_log),
                "new_session": self.new_session, "recorded_outcome": self.recorded_outcome, "outcome": self.outcome,
                "steps": self.steps, "fork_at": self.fork_at, "reproduced": self.reproduced,
                "divergences": [d.__dict__ for d in self.divergences],
                "differences": [d.__dict__ for d in self.differences], "warnings": self.warnings}


def replay(log_path: Path, *, log_dir: Path, fork_at: int | None = None, live=None, out_dir: Path | None = None,
           docs_dir: Path | None = None, workspace: Path | None = None, compile: bool | None = None,
           max_turns: int | None = None, say: Callable[[str], None] = print) -> ReplayReport:
    """Replay `log_path` (or, with `fork_at` and `live`, fork it). `compile` overrides the
    recorded sm_90a cross-compile setting and `max_turns` the turn budget (None: as recorded)."""
    log_path = Path(log_path)
    events, warnings = read_events(log_path)
    for w in warnings:
        say(f"warning: {w}")
    start = events[0]
    recorded_steps = sorted({e.step for e in events if isinstance(e, ModelResponse)})
    if fork_at is not None:
        if live is None:
            raise LogError("--fork-at needs --backend: the live backend that continues the session")
        if not 0 <= fork_at <= len(recorded_steps):
            raise LogError(f"{log_path}: --fork-at must be between 0 and {len(recorded_steps)} (the recorded steps)")
    recorded_end = next((e for e in reversed(events) if isinstance(e, SessionEnded)), None)
    update = {}
    if compile is not None:
        update["compile"] = compile
    budget = start.config.budget.model_copy(update={"max_wall_s": None})  # another machine's speed is no budget
    if max_turns is not None:
        budget = budget.model_copy(update={"max_turns": max_turns})
    if fork_at is None:
        backend = ReplayBackend(events)
        config = start.config.model_copy(update=update | {"budget": budget})
        origin = {"replay_of": {"log": log_path.name, "session": start.session}}
        say(f"replaying {log_path.name}: session {start.session} ({start.config.backend} / {start.config.model}), "
            f"{len(recorded_steps)} recorded steps, kernels re-evaluated on this machine")
    else:
        backend = ForkBackend(ReplayBackend(events, upto_step=fork_at), live, fork_at)
        config = start.config.model_copy(update=update | {"budget": budget, "backend": live.name, "model": live.model,
                                                           "base_url": getattr(live, "base_url", None)})
        origin = {"forked_from": {"log": log_path.name, "session": start.session, "step": fork_at}}
        replayed = f"steps 0..{fork_at - 1} replayed" if fork_at else "nothing replayed"
        say(f"forking {log_path.name} at step {fork_at}: {replayed}, then {live.name} / {live.model}")
    seeds = {(e.step, e.call_id, e.device, e.shapes): e.seed for e in events if isinstance(e, Evaluation)}
    try:
        end, new_log = run_session(config, backend, log_dir=log_dir, workspace=workspace, out_dir=out_dir,
                                   docs_dir=docs_dir, say=say, seeds=seeds, **origin)
    finally:
        backend.close()
    new_events, _ = read_events(new_log)
    if new_events[0].pack.sha256 != start.pack.sha256:
        warnings.append("the knowledge pack differs from the recording's (pages or examples changed since)")
    verdicts, others = diverging(events, new_events, fork_at)
    report = ReplayReport(log=log_path, session=start.session, new_log=new_log, new_session=new_events[0].session,
                          recorded_outcome=recorded_end.outcome if recorded_end else None, outcome=end.outcome,
                          steps=end.totals.turns, divergences=verdicts, differences=others, warnings=warnings,
                          fork_at=fork_at)
    if fork_at is not None:
        report.recorded_outcome = None  # a fork is a new session: nothing to reproduce
    return report


def diverging(recorded: list, replayed: list, upto_step: int | None = None) -> tuple[list[Divergence], list[Divergence]]:
    """(evaluations whose outcome differs, other tool results that differ: ok vs error)."""
    def in_range(e):
        return upto_step is None or e.step < upto_step

    def evaluations(events):
        return {(e.step, e.call_id, e.device, e.shapes): e for e in events if isinstance(e, Evaluation) and in_range(e)}

    def results(events):
        return {(e.step, e.call_id): e for e in events if isinstance(e, ToolResult) and in_range(e)}

    verdicts, others = [], []
    rec_eval, new_eval = evaluations(recorded), evaluations(replayed)
    for key in sorted(set(rec_eval) | set(new_eval)):
        a, b = rec_eval.get(key), new_eval.get(key)
        what = f"{(a or b).purpose} ({key[2]}, {key[3]})"
        if a is None or b is None or a.outcome != b.outcome:
            verdicts.append(Divergence(key[0], what, a.outcome if a else "not evaluated", b.outcome if b else "not evaluated"))
    rec_res, new_res = results(recorded), results(replayed)
    for key in sorted(set(rec_res) | set(new_res)):
        a, b = rec_res.get(key), new_res.get(key)
        if a is None or b is None or a.is_error != b.is_error:
            others.append(Divergence(key[0], (a or b).name, _state(a), _state(b), _first_line(a), _first_line(b)))
    return sorted(verdicts, key=lambda d: d.step), sorted(others, key=lambda d: d.step)


def _state(result: ToolResult | None) -> str:
    return "not run" if result is None else "error" if result.is_error else "ok"


def _first_line(result: ToolResult | None, width: int = 90) -> str:
    """The first line of a tool's answer, cut to `width` characters ("" for none)."""
    line = (result.content.strip().splitlines() or [""])[0] if result is not None else ""
    return line if len(line) <= width else line[: width - 3] + "..."
