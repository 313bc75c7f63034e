"""The kernel-authoring loop: prompt, model turn, tools, feedback, until the kernel passes
(and meets its speed target where it can be timed) or the budget is spent.

    end = run_session(config, backend, log_dir=..., say=print)      # a new session
    end = resume_session(log_path, backend, say=print)               # a killed one, from its log

Every request, response, tool call, result, evaluation and note is an event in the
session's append-only log (agent/session.py), so a session can be resumed, replayed and
forked from its log alone.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Callable

from agent.backends.base import Backend, BackendError, RecordingExhausted, SessionContext
from agent.pack import build_pack
from agent.session import (
    ApiRetry, HarnessNote, LogError, Message, ModelRequest, ModelResponse, SessionConfig, SessionEnded, SessionLog,
    SessionResumed, SessionStarted, TextBlock, ToolCalled, ToolResult, Totals, new_session_id, read_events,
    truncated_last_line,
)
from agent.tools import TOOLS, ToolBox
from eval.kernel import GENERATED_DIR, REPO

DEFAULT_LOG_DIR = REPO / "logs"
WORKSPACES = REPO / ".epiforge" / "workspaces"  # git-ignored
_NUDGE = ("No tool call received. Work through the tools: write_kernel, run_check, then submit "
          "when the check passes.")
_MAX_IDLE = 2  # consecutive turns without a tool call before the session counts as given up


def environment() -> dict:
    """What the log records about this machine: versions, never paths or names."""
    from eval.machine import fingerprint, source_commit

    commit = source_commit()
    return fingerprint("cuda", commit=False) | {"system": platform.system(),
                                                "epiforge_commit": commit[:12] if commit else None}


def run_session(config: SessionConfig, backend: Backend, *, log_dir: Path = DEFAULT_LOG_DIR, log_path: Path | None = None,
                workspace: Path | None = None, out_dir: Path | None = GENERATED_DIR, docs_dir: Path | None = None,
                say: Callable[[str], None] = print, forked_from: dict | None = None,
                replay_of: dict | None = None, seeds: dict | None = None) -> tuple[SessionEnded, Path]:
    """Run one new session; returns its end event and the log's path. `out_dir=None` keeps
    a passing kernel out of generated_kernels/ (replays); `seeds` fixes the evaluation seeds
    by (step, call_id, device, shapes) (a replay reuses the recorded ones)."""
    import tasks

    task = tasks.get_task(config.task)
    config = config.model_copy(update={"task": task.name})
    pack = build_pack(task, docs_dir, config.pack_without)
    session_id = new_session_id(task.id)
    system = pack.system_prompt(speed_target=config.speed_target)
    prompt = pack.task_prompt(speed_target=config.speed_target)
    workspace = Path(workspace or WORKSPACES / session_id)
    workspace.mkdir(parents=True, exist_ok=True)
    backend.start(SessionContext(session_id, task, pack, workspace, system, prompt, config))  # may fail: no log yet
    log = SessionLog.create(log_path or Path(log_dir) / f"{session_id}.jsonl")
    log.write(SessionStarted(session=session_id, config=config, pack=pack.info(), system_sha256=_sha(system),
                             prompt=prompt, environment=environment(), backend_info=backend.info(),
                             forked_from=forked_from, replay_of=replay_of))
    say(f"session {session_id}: {task.name} with {backend.name} / {backend.model}; log {log.path}")
    toolbox = ToolBox(task=task, pack=pack, workspace=workspace, config=config, session_id=session_id, record=log.write,
                      seeds=dict(seeds or {}))
    driver = _Driver(config, backend, log, toolbox, system, [Message(role="user", content=[TextBlock(text=prompt)])],
                     say, out_dir)
    return driver.run(), log.path


def resume_session(log_path: Path, backend: Backend, *, workspace: Path | None = None,
                   out_dir: Path | None = GENERATED_DIR, docs_dir: Path | None = None,
                   say: Callable[[str], None] = print) -> tuple[SessionEnded, Path]:
    """Continue a killed session from its log, appending to the same file."""
    import tasks
    from agent.transcript import rebuild

    log_path = Path(log_path)
    events, warnings = read_events(log_path)
    for w in warnings:
        say(f"warning: {w}")
    state = rebuild(events)
    start = state.start
    if state.ended is not None:
        raise LogError(f"{log_path}: the session already ended ({state.ended.outcome}); replay or fork it instead")
    config = start.config
    task = tasks.get_task(config.task)
    pack = build_pack(task, docs_dir, config.pack_without)
    system = pack.system_prompt(speed_target=config.speed_target)
    if pack.sha256 != start.pack.sha256:
        say("warning: the knowledge pack changed since this session started; resuming with the current one")
    workspace = Path(workspace or WORKSPACES / start.session)
    workspace.mkdir(parents=True, exist_ok=True)
    backend.start(SessionContext(start.session, task, pack, workspace, system, start.prompt, config))
    skipped = truncated_last_line(log_path)
    log = SessionLog.append_to(log_path)
    log.write(SessionResumed(session=start.session, from_step=state.next_step, pack_sha256=pack.sha256,
                             skipped_line=skipped))
    toolbox = ToolBox(task=task, pack=pack, workspace=workspace, config=config, session_id=start.session,
                      record=log.write, sources=dict(state.sources), current=state.current, best=state.best,
                      evaluations=state.totals.evaluations)
    if state.current:
        toolbox.kernel_path.write_text(state.sources[state.current], encoding="utf-8")
    say(f"session {start.session}: resumed at step {state.next_step} with {backend.name} / {backend.model}")
    driver = _Driver(config, backend, log, toolbox, system, state.messages, say, out_dir,
                     step=state.next_step, totals=state.totals, idle=state.idle)
    if state.pending:  # the kill came between a response and (some of) its tool results
        driver.finish_step(state.next_step - 1, state.pending, had_calls=True, done=state.partial)
    return driver.run(), log.path


class _Driver:
    def __init__(self, config, backend, log, toolbox, system, messages, say, out_dir, *, step=0, totals=None, idle=0):
        self.config, self.backend, self.log, self.toolbox = config, backend, log, toolbox
        self.system, self.messages, self.say, self.out_dir = system, messages, say, out_dir
        self.step, self.idle = step, idle
        self.totals = totals or Totals()
        self.prior_wall = self.totals.wall_s
        self.started = time.monotonic()
        self.session = toolbox.session_id

    def run(self) -> SessionEnded:
        try:
            return self._loop()
        finally:
            self.log.close()

    def _loop(self) -> SessionEnded:
        while True:
            if self.toolbox.finished:
                return self._end("passed", "the submitted kernel passed")
            if self.idle >= _MAX_IDLE:
                return self._end("gave_up", f"{_MAX_IDLE} turns in a row without a tool call")
            stop = self._budget_spent()
            if stop:
                return self._end("passed_slow" if self.toolbox.slow_pass else "budget_exhausted", stop)
            self.log.write(ModelRequest(session=self.session, step=self.step, n_messages=len(self.messages),
                                        chars=sum(len(b.model_dump_json()) for m in self.messages for b in m.content)))
            try:
                turn = self.backend.complete(self.system, self.messages, TOOLS, step=self.step, on_retry=self._retried)
            except RecordingExhausted as e:
                return self._end("recording_exhausted", str(e))
            except BackendError as e:
                return self._end("backend_error", str(e))
            self.totals.turns += 1
            self.totals.usage = self.totals.usage + turn.usage
            if turn.cost_usd is not None:
                self.totals.cost_usd = round((self.totals.cost_usd or 0.0) + turn.cost_usd, 6)
            self.log.write(ModelResponse(session=self.session, step=self.step, content=turn.content,
                                         stop_reason=turn.stop_reason, usage=turn.usage, cost_usd=turn.cost_usd,
                                         latency_s=turn.latency_s, model=turn.model, source=turn.source,
                                         notes=turn.notes))
            self.messages.append(Message(role="assistant", content=turn.content or [TextBlock(text="(empty response)")]))
            said = " ".join(b.text for b in turn.content if b.type == "text").strip()
            if said:
                self.say(f"step {self.step}: model: {_clip(said, 110)}")
            self.finish_step(self.step, turn.tool_calls, had_calls=bool(turn.tool_calls), stop_reason=turn.stop_reason)
            self.step += 1

    def finish_step(self, step: int, calls, *, had_calls: bool, stop_reason: str | None = None, done=()) -> None:
        """Run this step's tool calls, log them, and queue the next user message (after
        `done`: results of this step's calls that a killed run already logged)."""
        blocks, names = list(done), []
        for call in calls:
            self.log.write(ToolCalled(session=self.session, step=step, call_id=call.id, name=call.name, input=call.input))
            t0 = time.monotonic()
            block = self.toolbox.run(call, step)
            self.log.write(ToolResult(session=self.session, step=step, call_id=call.id, name=call.name,
                                      is_error=block.is_error, content=block.content,
                                      seconds=round(time.monotonic() - t0, 3)))
            blocks.append(block)
            names.append(f"{call.name}{' (error)' if block.is_error else ''}")
            if self.toolbox.finished:
                break  # the session is over; later calls of this turn are moot
        self.say(f"step {step}: " + (", ".join(names) if names else f"no tool call ({stop_reason or 'end of turn'})")
                 + self._last_outcome(step))
        self.idle = 0 if had_calls else self.idle + 1
        if self.toolbox.finished:
            return
        notes = []
        if not had_calls:
            notes.append(_NUDGE)
        if stop_reason == "max_tokens":
            notes.append("Your last answer was cut off at the output-token limit; keep kernels and text short.")
        turns_left = self.config.budget.max_turns - self.totals.turns
        if turns_left == 1:
            notes.append("One turn of the budget is left: submit your best kernel now.")
        for text in notes:
            self.log.write(HarnessNote(session=self.session, step=step, text=text))
        self.messages.append(Message(role="user", content=[*blocks, *[TextBlock(text=t) for t in notes]]))

    def _last_outcome(self, step: int) -> str:
        last = self.toolbox.last
        if last is None or last.step != step:
            return ""
        return f" -> {last.outcome}" + ("" if last.outcome == "PASSED" else f": {_clip(last.message, 90)}")

    def _retried(self, attempt: int, error: str, wait_s: float) -> None:
        self.log.write(ApiRetry(session=self.session, step=self.step, attempt=attempt, error=error, wait_s=wait_s))
        self.say(f"step {self.step}: retry {attempt} in {wait_s:.1f} s: {error}")

    def _wall(self) -> float:
        return round(self.prior_wall + time.monotonic() - self.started, 3)

    def _budget_spent(self) -> str | None:
        b, t = self.config.budget, self.totals
        if t.turns >= b.max_turns:
            return f"turn budget spent ({t.turns} of {b.max_turns})"
        if b.max_tokens is not None and t.usage.total >= b.max_tokens:
            return f"token budget spent ({t.usage.total} of {b.max_tokens})"
        if b.max_usd is not None and (t.cost_usd or 0.0) >= b.max_usd:
            return f"dollar budget spent (${t.cost_usd:.4f} of ${b.max_usd})"
        if b.max_wall_s is not None and self._wall() >= b.max_wall_s:
            return f"wall-time budget spent ({self._wall():.0f} s of {b.max_wall_s:.0f} s)"
        return None

    def _end(self, outcome: str, reason: str) -> SessionEnded:
        self.totals.wall_s = self._wall()
        self.totals.evaluations = self.toolbox.evaluations
        generated = None
        sha = self.toolbox.current if outcome == "passed" else self.toolbox.slow_pass if outcome == "passed_slow" else None
        if sha and self.out_dir is not None:
            path = write_generated(self.toolbox.sources[sha], self.toolbox.task.name, self.session,
                                   self.config.backend, self.config.model, Path(self.out_dir))
            generated = os.path.relpath(path, REPO) if Path(path).resolve().is_relative_to(REPO) else str(path)
        end = SessionEnded(session=self.session, outcome=outcome, reason=reason, best=self.toolbox.best,
                           generated_kernel=str(generated) if generated else None, totals=self.totals)
        self.log.write(end)
        cost = "unpriced" if self.totals.cost_usd is None else f"${self.totals.cost_usd:.4f}"
        self.say(f"session {self.session}: {outcome} ({reason}); {self.totals.turns} turns, "
                 f"{self.totals.usage.total} tokens, {cost}, {self.totals.wall_s:.0f} s"
                 + (f"; kernel {generated}" if generated else ""))
        return end


def write_generated(source: str, task_name: str, session: str, backend: str, model: str, out_dir: Path) -> Path:
    """Save a passing kernel as generated_kernels/<task>/<session>.py, stamped with where it came
    from (SESSION, BACKEND, MODEL right after TASK; any the model wrote are replaced). Never overwrites."""
    lines = source.splitlines()
    tree = ast.parse(source)
    drop, after = set(), 0
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("SESSION", "BACKEND", "MODEL"):
                drop.update(range(node.lineno - 1, node.end_lineno))
            elif name == "TASK":
                after = node.end_lineno
    stamp = [f"SESSION = {json.dumps(session)}", f"BACKEND = {json.dumps(backend)}", f"MODEL = {json.dumps(model)}"]
    kept = [(i, line) for i, line in enumerate(lines) if i not in drop]
    out = [line for i, line in kept if i < after] + stamp + [line for i, line in kept if i >= after]
    path = Path(out_dir) / task_name / f"{session}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "x", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return path


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
