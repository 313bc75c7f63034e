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
import re
import time
from pathlib import Path
from typing import Callable

from epiforge.agent.backends.base import Backend, BackendError, RecordingExhausted, SessionContext, WallTimeExhausted
from epiforge.agent.backends.replay_backend import ReplayBackend
from epiforge.agent.pack import build_pack
from epiforge.agent.pricing import cost_usd, session_price
from epiforge.agent.session import (
    ApiRetry, ConfigError, HarnessNote, LogError, Message, ModelRequest, ModelResponse, SessionConfig, SessionEnded,
    SessionLog, SessionResumed, SessionStarted, TextBlock, ToolCalled, ToolResult, Totals, Usage, new_session_id,
    read_events, truncated_last_line,
)
from epiforge.agent.tools import TOOLS, Heartbeat, ToolBox
from epiforge.eval.kernel import REPO, Origin, write_origin
from epiforge.eval.machine import data_dir
from epiforge.text import counted

_NUDGE = ("No tool call received. Work through the tools: write_kernel, run_check, then submit "
          "when the check passes.")
_MAX_IDLE = 2  # consecutive turns without a tool call before the session counts as given up
_CHARS_PER_TOKEN = 4.0  # the request-size estimate before a server has reported any tokens
_MIN_OUTPUT_ESTIMATE = 1024  # output tokens a request is assumed to cost before the session has seen larger


def config_problem(config: SessionConfig) -> str | None:
    """Why a session with this configuration cannot run, in one line, or None."""
    problem = config.budget.problem()
    if problem:
        return problem
    if config.max_output_tokens < 1:
        return f"--max-output-tokens must be at least 1 (got {config.max_output_tokens})"
    if not config.speed_target > 0:
        return f"--speed-target must be more than 0 (got {config.speed_target:g})"
    if (config.price_in is None) != (config.price_out is None):
        return "--price-in and --price-out go together: give both (USD per million tokens) or neither"
    if config.price_in is not None and (config.price_in < 0 or config.price_out < 0):
        return "--price-in and --price-out must not be negative"
    if config.budget.max_usd is not None and session_price(config) is None:
        return (f"--budget-usd needs a price for model {config.model!r}, which agent/pricing.py does not list: "
                "give --price-in and --price-out (USD per million tokens)")
    return None


def folder_problem(flag: str, path: Path | None) -> str | None:
    """Why a session cannot write in the folder `path` (`flag` names it), in one line, or None.
    Asked before anything starts, so that a bad folder costs nothing and leaves no log."""
    if path is None:
        return None
    path = there = Path(path)
    # a folder of the data directory is there by default, not by the flag: name what moves it
    name = f"{path} (the data directory's; EPIFORGE_DATA_DIR moves it)" if path.is_relative_to(data_dir()) \
        else f"{flag} {path}"
    try:
        while not there.exists() and there.parent != there:  # the nearest part that exists
            there = there.parent
        if not there.is_dir():
            return f"{name}: " + ("not a directory" if there == path else f"{there} is not a directory")
    except OSError as e:
        return f"{name}: {e.strerror}"
    if not os.access(there, os.W_OK | os.X_OK):
        return f"{name}: {there} is not writable"
    return None


def output_file_problem(flag: str, path: Path) -> str | None:
    """Why a file cannot be written at `path` (a report, a page; `flag` names it), in one line,
    or None. Its missing folders are made when it is written; asked before any work starts."""
    if path.is_dir():
        return f"{flag} {path}: a directory, not a file"
    if path.exists():
        return None if os.access(path, os.W_OK) else f"{flag} {path}: not writable"
    return folder_problem(flag, path)  # the nearest folder that exists must take it


#: the file a session leaves in its workspace (the session's id): a folder holding it, or
#: nothing, may be written over; any other folder is the user's
WORKSPACE_MARK = ".epiforge-workspace"


def workspace_problem(path: Path) -> str | None:
    """Why a session must not write in the existing folder `path` (it writes PROMPT.md, check,
    kernel.py and docs/ over whatever is there), in one line, or None: a new or empty folder,
    or one a session made (its mark, or the check script of a workspace made before the mark)."""
    try:
        if not path.is_dir() or (path / WORKSPACE_MARK).is_file():
            return None
        entries = sorted(e.name for e in path.iterdir())
        check = path / "check"
        if not entries or (check.is_file() and "epiforge.agent.check" in check.read_text(errors="replace")):
            return None
    except OSError:
        return None  # folder_problem says why it cannot be used
    shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
    return (f"--workspace {path}: holds files no epiforge session wrote ({shown}); a session writes PROMPT.md, check "
            "and kernel.py there: name a new or empty folder")


def folders_problem(*, log_dir: Path | None, workspace: Path | None, out_dir: Path | None) -> str | None:
    """The first folder a session writes in (its log's, its workspace, its kernels') that it
    cannot, in one line naming the flag that sets it, or None."""
    for flag, path in (("--log-dir", log_dir), ("--workspace", workspace), ("--out", out_dir)):
        problem = folder_problem(flag, path)
        if problem:
            return problem
    return None


def _make_workspace(workspace: Path, session_id: str) -> None:
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / WORKSPACE_MARK).write_text(session_id + "\n", encoding="utf-8")


class KernelNotSaved(Exception):
    """A session ended, its log complete, but its passing kernel could not be written (one line)."""


def data_path(name: str) -> Path:
    """A folder of the per-user data directory (eval/machine.py data_dir()), where sessions
    write unless a flag says otherwise: "sessions" (logs), "kernels" (passing kernels,
    <task>/<session>.py), "workspaces", "replays", "ablations"."""
    return data_dir() / name


def beside(log_dir: Path, name: str) -> Path:
    """Where a session logged in `log_dir` keeps its passing kernels (`name` "kernels") or its
    workspaces ("workspaces"). A log folder in the data directory, or inside the repository,
    uses the data directory's: nothing goes into the source tree unless --out or --workspace
    names it (the committed track, generated_kernels/, takes `--out generated_kernels`). Any
    other log folder keeps them beside its logs, in LOG_DIR/generated_kernels and
    LOG_DIR/workspaces, so that a run told to log elsewhere keeps everything together there."""
    log_dir = Path(log_dir).resolve()
    if log_dir.is_relative_to(data_dir().resolve()) or log_dir.is_relative_to(REPO):
        return data_path(name)
    return log_dir / {"kernels": "generated_kernels"}.get(name, name)


def environment() -> dict:
    """What the log records about this machine: versions, never paths or names."""
    from epiforge.eval.machine import fingerprint, source_commit

    commit = source_commit()
    return fingerprint("cuda", commit=False) | {"system": platform.system(),
                                                "epiforge_commit": commit[:12] if commit else None}


def run_session(config: SessionConfig, backend: Backend, *, log_dir: Path | None = None, log_path: Path | None = None,
                workspace: Path | None = None, out_dir: Path | None | str = "beside", docs_dir: Path | None = None,
                say: Callable[[str], None] = print, forked_from: dict | None = None,
                replay_of: dict | None = None, seeds: dict | None = None,
                workspaces: Path | None = None, session_id: str | None = None,
                note: Callable[[str], None] | None = None) -> tuple[SessionEnded, Path]:
    """Run one new session; returns its end event and the log's path. The log goes to
    `log_path`, else `log_dir`/ID.jsonl (default: the data directory's sessions/); a passing
    kernel to `out_dir`/<task>/ID.py (default "beside": beside(log folder, "kernels");
    None writes none: replays); `seeds` fixes the evaluation seeds by (step, call_id,
    device, shapes) (a replay reuses the recorded ones); the workspace is `workspace`, else
    `workspaces`/ID (default: beside(log folder, "workspaces")/ID); `session_id`: the new
    session's id, chosen by the caller (default: a fresh one); `note`: where the pack's
    screening says how it goes (default: `say`; ScreenWatch)."""
    from epiforge import tasks

    task = tasks.get_task(config.task)
    config = config.model_copy(update={"task": task.name})
    problem = None if isinstance(backend, ReplayBackend) else config_problem(config)  # a replay spends nothing
    session_id = session_id or new_session_id(task.id)
    log_path = Path(log_path or Path(log_dir or data_path("sessions")) / f"{session_id}.jsonl")
    if out_dir == "beside":
        out_dir = beside(log_path.parent, "kernels")
    given = workspace is not None  # the user's folder: a default one is new, or a session's own
    workspace = Path(workspace or Path(workspaces or beside(log_path.parent, "workspaces")) / session_id)
    problem = problem or folders_problem(log_dir=log_path.parent, workspace=workspace, out_dir=out_dir)
    problem = problem or (workspace_problem(workspace) if given else None)
    if problem:
        raise ConfigError(problem)
    with ScreenWatch(note or say, task.id, config.budget.max_wall_s) as watch:
        pack = build_pack(task, docs_dir, config.pack_without, watch=watch)
    system = pack.system_prompt(speed_target=config.speed_target)
    prompt = pack.task_prompt(speed_target=config.speed_target)
    _make_workspace(workspace, session_id)
    backend.start(SessionContext(session_id, task, pack, workspace, system, prompt, config))  # may fail: no log yet
    log = SessionLog.create(log_path)
    log.write(SessionStarted(session=session_id, config=config, pack=pack.info(), system_sha256=_sha(system),
                             prompt=prompt, environment=environment(), backend_info=backend.info(),
                             forked_from=forked_from, replay_of=replay_of, screen_s=watch.seconds))
    say(f"session {session_id}: {task.name} with {backend.name} / {backend.model}; log {log.path}")
    toolbox = ToolBox(task=task, pack=pack, workspace=workspace, config=config, session_id=session_id, record=log.write,
                      seeds=dict(seeds or {}), say=say)
    driver = _Driver(config, backend, log, toolbox, system, [Message(role="user", content=[TextBlock(text=prompt)])],
                     say, out_dir, screen_s=watch.seconds)
    return driver.run(stop=pack.unscreened), log.path


def resume_session(log_path: Path, backend: Backend, *, config: SessionConfig | None = None,
                   workspace: Path | None = None, out_dir: Path | None = None, docs_dir: Path | None = None,
                   say: Callable[[str], None] = print, note: Callable[[str], None] | None = None,
                   ) -> tuple[SessionEnded, Path]:
    """Continue a killed session, or one that ended on a backend error, from its last finished
    step, appending to the same log. `config` replaces the recorded configuration from here on
    (the CLI's flags and environment over the log's; None: the latest one the log recorded).
    The workspace and a passing kernel go where beside(the log's folder) says, unless
    `workspace` and `out_dir` say otherwise; `note`: as run_session's."""
    from epiforge import tasks
    from epiforge.agent.transcript import rebuild

    log_path = Path(log_path)
    events, warnings = read_events(log_path)
    for w in warnings:
        say(f"warning: {w}")
    state = rebuild(events)
    start = state.start
    if state.ended is not None and state.ended.outcome != "backend_error":
        raise LogError(f"{log_path}: the session already ended ({state.ended.outcome}); only a session that ended "
                       "on a backend error can be resumed: replay or fork it instead")
    config = (config or state.config).model_copy(update={"task": start.config.task})
    given = workspace is not None
    workspace = Path(workspace or beside(log_path.parent, "workspaces") / start.session)
    out_dir = out_dir or beside(log_path.parent, "kernels")
    problem = config_problem(config) or folders_problem(log_dir=None, workspace=workspace, out_dir=out_dir)
    problem = problem or (workspace_problem(workspace) if given else None)
    if not problem and not os.access(log_path, os.W_OK):
        problem = f"--resume {log_path}: not writable (a resume appends to its log)"
    if problem:
        raise ConfigError(problem)
    task = tasks.get_task(config.task)
    with ScreenWatch(note or say, task.id, config.budget.max_wall_s, used_s=state.totals.wall_s) as watch:
        pack = build_pack(task, docs_dir, config.pack_without, watch=watch)
    system = pack.system_prompt(speed_target=config.speed_target)
    if pack.sha256 != start.pack.sha256 and not pack.unscreened:
        say("warning: the knowledge pack changed since this session started; resuming with the current one")
    _make_workspace(workspace, start.session)
    backend.start(SessionContext(start.session, task, pack, workspace, system, start.prompt, config))
    skipped = truncated_last_line(log_path)
    log = SessionLog.append_to(log_path)
    log.write(SessionResumed(session=start.session, from_step=state.next_step, pack_sha256=pack.sha256,
                             skipped_line=skipped, after_outcome=state.ended.outcome if state.ended else None,
                             config=config, screen_s=watch.seconds))
    toolbox = ToolBox(task=task, pack=pack, workspace=workspace, config=config, session_id=start.session,
                      record=log.write, sources=dict(state.sources), current=state.current, best=state.best,
                      evaluations=state.totals.evaluations, say=say)
    if state.current:
        toolbox.kernel_path.write_text(state.sources[state.current], encoding="utf-8")
    after = f" after {state.ended.outcome} ({state.ended.reason})" if state.ended else ""
    say(f"session {start.session}: resumed at step {state.next_step}{after} with {backend.name} / {backend.model}")
    driver = _Driver(config, backend, log, toolbox, system, state.messages, say, out_dir,
                     step=state.next_step, totals=state.totals, idle=state.idle, screen_s=watch.seconds)
    if state.pending and not pack.unscreened:  # the kill came between a response and (some of) its tool results
        driver.finish_step(state.next_step - 1, state.pending, had_calls=True, done=state.partial)
    return driver.run(stop=pack.unscreened), log.path


class ScreenWatch(Heartbeat):
    """The knowledge pack's screening (agent/screen.py) as a session lives it, build_pack's
    `watch`: a verdict not cached yet is an evaluation on the CPU, so a stale cache can take
    minutes. Screening that takes FIRST_S says so on `note`, then again every EVERY_S; once
    `used_s` (the session's wall time before it) and the screening's own time spend the
    wall-time budget `budget_s`, it stops before the next verdict. The verdicts in by then
    stay cached: the next session starts from them. `seconds`: how long it took."""

    FIRST_S, EVERY_S = 2.0, 10.0

    def __init__(self, note: Callable[[str], None], task_id: str, budget_s: float | None, used_s: float = 0.0):
        super().__init__(self.FIRST_S, self.EVERY_S)
        self.note, self.task_id, self.budget_s, self.used_s = note, task_id, budget_s, used_s
        self.done = self.total = 0
        self.seconds, self.spoke, self.stopped = 0.0, False, False

    def __exit__(self, *exc):
        self.seconds = round(self.elapsed(), 3)
        super().__exit__(*exc)
        if not self.stopped:
            self.done = self.total  # asked before each verdict: the last one is in too
        if self.spoke and exc[0] is None:
            done = "stopped at the wall-time budget" if self.stopped else "done"
            self.note(f"screening the knowledge pack for {self.task_id}: {done}, {self.done} of {self.total} "
                      f"verdicts in, {self.seconds:.0f} s")

    def __call__(self, done: int, total: int) -> str | None:
        self.done, self.total = done, total
        screening = self.elapsed()
        if self.budget_s is None or self.used_s + screening < self.budget_s:
            return None
        self.stopped = True
        return (f"wall-time budget: {self.used_s + screening:.0f} of {self.budget_s:.0f} s used, {screening:.0f} s "
                f"of it screening the knowledge pack for {self.task_id}; {done} of its {total} verdicts are in, "
                "cached for the next session")

    def beat(self) -> None:
        line = f"screening the knowledge pack for {self.task_id}: {self.done} of {self.total} verdicts in, " \
               f"{self.elapsed():.0f} s"
        if self.budget_s is not None:
            line += f" (the wall-time budget has {max(0.0, self.budget_s - self.used_s - self.elapsed()):.0f} s left)"
        if not self.spoke:
            line += "; a verdict not cached yet is an evaluation on the CPU (agent/screen.py)"
        self.spoke = True
        self.note(line)


class _Driver:
    def __init__(self, config, backend, log, toolbox, system, messages, say, out_dir, *, step=0, totals=None, idle=0,
                 screen_s=0.0):
        self.config, self.backend, self.log, self.toolbox = config, backend, log, toolbox
        self.system, self.messages, self.say, self.out_dir = system, messages, say, out_dir
        self.step, self.idle = step, idle
        self.totals = totals or Totals()
        self.screen_s = screen_s  # the pack's screening just now: wall time spent before the first request
        self.prior_wall = self.totals.wall_s + screen_s
        self.started = time.monotonic()
        self.session = toolbox.session_id
        self.prices = session_price(config)
        self.fixed_chars = len(system) + len(json.dumps([t.__dict__ for t in TOOLS]))
        # what the requests so far cost, for the estimate of the next one
        self.tokens_per_char: float | None = None
        self.input_usd_per_token: float | None = None
        self.largest_output = _MIN_OUTPUT_ESTIMATE
        self.slowest_s = 0.0
        self.replayed_turns, self.replayed_usd = 0, 0.0  # recorded responses: their dollars are not spent again
        toolbox.time_left = self._wall_left

    def run(self, stop: str | None = None) -> SessionEnded:
        """The session's turns until it ends; `stop`: why it ends before any (budget_exhausted)."""
        try:
            return self._end("budget_exhausted", stop) if stop else self._loop()
        finally:
            self.log.close()

    def _loop(self) -> SessionEnded:
        while True:
            if self.toolbox.finished:
                how = self.toolbox.passed_how
                return self._end("passed", "the submitted kernel passed" + (f": {how}" if how else ""))
            if self.idle >= _MAX_IDLE:
                return self._end("gave_up", f"{_MAX_IDLE} turns in a row without a tool call")
            stop = self._budget_stop(self._estimate(self.messages))
            if stop:
                return self._end("passed_slow" if self.toolbox.slow_pass else "budget_exhausted", stop)
            chars = self._chars(self.messages)
            self.log.write(ModelRequest(session=self.session, step=self.step, n_messages=len(self.messages),
                                        chars=chars - self.fixed_chars))
            try:
                turn = self.backend.complete(self.system, self.messages, TOOLS, step=self.step, on_retry=self._retried,
                                             time_left=self._wall_left)
            except WallTimeExhausted as e:  # retrying would outlast --max-wall-s
                return self._end("passed_slow" if self.toolbox.slow_pass else "budget_exhausted", str(e))
            except RecordingExhausted as e:
                return self._end("recording_exhausted", str(e))
            except BackendError as e:
                return self._end("backend_error", str(e))
            turn.cost_usd = self._cost(turn)
            if turn.source == "replay":
                self.replayed_turns += 1
                self.replayed_usd += turn.cost_usd or 0.0
            self._learn(turn, chars)
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
        last = self._last_turn(self.messages + [Message(role="user", content=blocks or [TextBlock(text="")])])
        if last:
            notes.append(f"This is the last turn the budget allows ({last}): submit your best kernel now.")
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

    def _wall_left(self) -> float | None:
        b = self.config.budget
        return None if b.max_wall_s is None else b.max_wall_s - self._wall()

    # ---- what a request costs ------------------------------------------------------------

    def _cost(self, turn) -> float | None:
        """A live turn priced at the session's prices (--price-in/--price-out, else the table's
        for the model the server named, else for the configured model); a replayed one as recorded."""
        if turn.source == "replay":
            return turn.cost_usd
        if self.config.price_in is not None:
            return cost_usd(None, turn.usage, self.prices)
        return turn.cost_usd if turn.cost_usd is not None else cost_usd(None, turn.usage, self.prices)

    def _learn(self, turn, chars: int) -> None:
        u = turn.usage
        sent = u.input_tokens + u.cache_read_tokens + u.cache_write_tokens
        if sent and chars:
            self.tokens_per_char = sent / chars
            if self.prices is not None:
                self.input_usd_per_token = cost_usd(None, u.model_copy(update={"output_tokens": 0}), self.prices) / sent
        self.largest_output = max(self.largest_output, u.output_tokens)
        self.slowest_s = max(self.slowest_s, turn.latency_s)

    def _chars(self, messages) -> int:
        return self.fixed_chars + sum(len(b.model_dump_json()) for m in messages for b in m.content)

    def _estimate(self, messages) -> tuple[int, float | None, float]:
        """(tokens, dollars, seconds) the request of `messages` may cost: its input from its
        size (at the last request's tokens per character and dollars per input token, which
        prompt caching lowers), its output the largest this session has seen (at least
        _MIN_OUTPUT_ESTIMATE, at most --max-output-tokens), its time the slowest turn's."""
        tokens_in = round(self._chars(messages) * (self.tokens_per_char or 1 / _CHARS_PER_TOKEN))
        tokens_out = min(self.largest_output, self.config.max_output_tokens)
        dollars = None
        if self.prices is not None:
            per_in = self.input_usd_per_token or self.prices[0] * 1.25 / 1e6  # the first request writes the cache
            dollars = tokens_in * per_in + tokens_out * self.prices[1] / 1e6
        return tokens_in + tokens_out, dollars, self.slowest_s

    def _budget_stop(self, estimate, times: int = 1) -> str | None:
        """Why the budget does not allow `times` more requests of this estimate, or None."""
        b, t = self.config.budget, self.totals
        tokens, dollars, seconds = estimate
        if t.turns + times > b.max_turns:
            return f"turn budget: {t.turns} of {b.max_turns} turns used"
        if b.max_tokens is not None and t.usage.total + times * tokens > b.max_tokens:
            return (f"token budget: {t.usage.total:,} of {b.max_tokens:,} tokens used, "
                    f"and a request may take about {tokens:,}")
        if b.max_usd is not None and dollars is not None and (t.cost_usd or 0.0) + times * dollars > b.max_usd:
            return (f"dollar budget: ${t.cost_usd or 0.0:.4f} of ${b.max_usd:.2f} spent, "
                    f"and a request may cost about ${dollars:.4f}")
        if b.max_wall_s is not None and self._wall() + times * seconds >= b.max_wall_s:
            return (f"wall-time budget: {self._wall():.0f} of {b.max_wall_s:.0f} s used"
                    + (f" ({self.screen_s:.0f} s of it screening the knowledge pack)" if self.screen_s >= 1 else "")
                    + (f", and a turn may take about {seconds:.0f} s" if seconds else ""))
        return None

    def _last_turn(self, messages) -> str | None:
        """Which budget makes the next request the last one, in a few words, or None."""
        estimate = self._estimate(messages)
        if self._budget_stop(estimate):
            return None  # not even the next request: the session ends before it
        return self._budget_stop(estimate, times=2)

    def _end(self, outcome: str, reason: str) -> SessionEnded:
        self.totals.wall_s = self._wall()
        self.totals.evaluations = self.toolbox.evaluations
        generated = unsaved = None
        sha = self.toolbox.current if outcome == "passed" else self.toolbox.slow_pass if outcome == "passed_slow" else None
        if sha and self.out_dir is not None:
            try:
                path = write_generated(self.toolbox.sources[sha], self.toolbox.task.name, self.session,
                                       self.config.backend, self.config.model, Path(self.out_dir))
                generated = os.path.relpath(path, REPO) if Path(path).resolve().is_relative_to(REPO) else str(path)
            except OSError as e:  # the end is logged all the same: the log holds the kernel's source
                unsaved = f"--out {self.out_dir}: the passing kernel could not be written ({e.strerror or e})"
        end = SessionEnded(session=self.session, outcome=outcome, reason=reason, best=self.toolbox.best,
                           generated_kernel=str(generated) if generated else None, totals=self.totals)
        self.log.write(end)
        self.backend.ended(outcome, reason)
        cost = "unpriced" if self.totals.cost_usd is None else f"${self.totals.cost_usd:.4f}"
        if self.replayed_turns and self.totals.cost_usd is None:
            cost = "unpriced, nothing spent now"
        elif self.replayed_turns:
            live = self.totals.cost_usd - self.replayed_usd
            cost = (f"${live:.4f} spent now" if self.totals.turns > self.replayed_turns else "nothing spent now") + (
                f" (the recording's ${self.replayed_usd:.4f} for {self.replayed_turns} replayed turns is not spent again)")
        self.say(f"session {self.session}: {outcome} ({reason}); {counted(self.totals.turns, 'turn')}, "
                 f"{self.totals.usage.total} tokens, {cost}, {self.totals.wall_s:.0f} s"
                 + (f"; kernel {generated}" if generated else ""))
        if unsaved:
            raise KernelNotSaved(f"{unsaved}; the session's log {self.log.path} is complete and holds its source")
        return end


def write_generated(source: str, task_name: str, session: str, backend: str, model: str, out_dir: Path) -> Path:
    """Save a passing kernel as OUT_DIR/<task>/<session>.py with the harness's record of where
    it came from beside it (<session>.origin.json, eval/kernel.py Origin: what the Result's
    provenance is read from), and stamped for a reader (SESSION, BACKEND, MODEL right after
    TASK; any the model wrote are replaced). Never overwrites a kernel: the same text already
    there (a resumed session passing again) is kept; another text goes to
    <session>-<sha256 prefix>.py."""
    lines = re.split(r"\r\n|\r|\n", source)  # the line breaks ast counts (splitlines also splits on \f, \u2028, ...)
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
    text = "\n".join(out) + "\n"
    path = Path(out_dir) / task_name / f"{session}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text(encoding="utf-8") != text:
        path = path.with_name(f"{session}-{_sha(text)[:8]}.py")  # an existing one is the same text, by its hash
    if not path.exists():
        with open(path, "x", encoding="utf-8") as f:
            f.write(text)
    write_origin(path, Origin(session=session, backend=backend, model=model, kernel_sha256=_sha(text)))
    return path


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
