"""`epiforge sessions list|show`: what session logs say, read from the logs alone.

A session's outcome is its last session_ended event, unless it was resumed after that; a
log with none is "unfinished" (killed, or still running: --resume continues it).
"""

from __future__ import annotations

from pathlib import Path

from epiforge.agent.session import Evaluation, LogError, ModelResponse, SessionEnded, SessionResumed, ToolResult, read_events
from epiforge.agent.transcript import rebuild
from epiforge.text import counted

PASSED = ("passed", "passed_slow")  # the outcomes that are a pass


def last_end(events: list) -> SessionEnded | None:
    """How a session ended: its last session_ended event, unless a session_resumed came after
    it (then it is unfinished again until it ends anew)."""
    end = None
    for e in events:
        if isinstance(e, SessionEnded):
            end = e
        elif isinstance(e, SessionResumed):
            end = None
    return end


def counts_as_pass(end: SessionEnded | None) -> bool | None:
    """The rule by which a session counts in pass@k, for `generate --runs` (agent/runs.py) and
    the leaderboard (eval/leaderboard.py agent_rows) alike. Not counted (None): an unfinished
    session, whose log has no session_ended event (killed, cut off by Ctrl-C, failed before
    its log began), one that ended on a backend error (an outage says nothing of the
    model, and `generate --resume` continues it), and one whose budget ran out before the
    model answered once (0 turns: the knowledge pack's screening or a budget too small for
    the first request spent it; the model was never asked). Any other end is a pass (True)
    when it is passed or passed_slow, else a failure (False); a resumed session counts by
    its last end."""
    if end is None or end.outcome == "backend_error":
        return None
    if end.outcome == "budget_exhausted" and end.totals.turns == 0:
        return None
    return end.outcome in PASSED


def summarize(path: Path) -> dict | str:
    """One session's row (session, task, backend, model, outcome, turns, tokens, cost_usd,
    kernel, pass: how it counts in pass@k (counts_as_pass), log), or a line saying why `path` is not a usable session log."""
    try:
        events, _ = read_events(path)
    except LogError as e:
        return str(e)
    state = rebuild(events)
    start, end = state.start, state.ended
    totals = end.totals if end else state.totals
    return {"session": start.session, "task": start.config.task, "backend": state.config.backend,
            "model": state.config.model, "outcome": end.outcome if end else "unfinished",
            "reason": end.reason if end else "no session_ended event: killed or still running (--resume continues it)",
            "turns": totals.turns, "tokens": totals.usage.total, "cost_usd": totals.cost_usd,
            "kernel": end.generated_kernel if end else None, "pass": counts_as_pass(end), "replay_of": start.replay_of,
            "forked_from": start.forked_from, "log": str(path)}


def find_log(session: str, log_dirs: list[Path]) -> Path:
    """A log's path from a session id (DIR/ID.jsonl in one of `log_dirs`) or a path."""
    path = Path(session)
    if path.suffix == ".jsonl" or path.exists():
        if not path.is_file():
            raise LogError(f"{path}: no such session log")
        return path
    for d in log_dirs:
        if (Path(d) / f"{session}.jsonl").is_file():
            return Path(d) / f"{session}.jsonl"
    hits = [p for d in log_dirs for p in sorted(Path(d).glob(f"*{session}*.jsonl"))]
    if len(hits) == 1:
        return hits[0]
    where = ", ".join(str(d) for d in log_dirs)
    if hits:
        raise LogError(f"{session!r} matches {len(hits)} logs in {where}: give more of the id")
    raise LogError(f"no session {session!r} in {where} (epiforge sessions list shows them)")


def describe_session(path: Path) -> tuple[str, dict]:
    """(text for a person, the same as JSON) of one session: its row, its configuration,
    and per step what the model called and what the evaluations said."""
    row = summarize(path)
    if isinstance(row, str):
        raise LogError(row)
    events, _ = read_events(path)
    state = rebuild(events)
    steps: dict[int, dict] = {}
    for e in events:
        if isinstance(e, ModelResponse):
            steps[e.step] = {"step": e.step, "tools": [], "evaluations": [], "cost_usd": e.cost_usd,
                             "tokens": e.usage.total, "source": e.source}
        elif isinstance(e, ToolResult) and e.step in steps:
            steps[e.step]["tools"].append(e.name + (" (error)" if e.is_error else ""))
        elif isinstance(e, Evaluation) and e.step in steps:
            steps[e.step]["evaluations"].append(f"{e.purpose} {e.device}/{e.shapes}: {e.outcome}")
    data = row | {"config": state.config.model_dump(mode="json"), "steps": [steps[k] for k in sorted(steps)]}
    cost = "unpriced" if row["cost_usd"] is None else f"${row['cost_usd']:.4f}"
    b = state.config.budget
    lines = [f"session {row['session']}: {row['task']} with {row['backend']} / {row['model']}",
             f"  outcome: {row['outcome']} ({row['reason']})",
             f"  {counted(row['turns'], 'turn')}, {row['tokens']:,} tokens, {cost}",
             f"  budget: {counted(b.max_turns, 'turn')}" + (f", {b.max_tokens:,} tokens" if b.max_tokens else "")
             + (f", ${b.max_usd:g}" if b.max_usd else "") + (f", {b.max_wall_s:g} s" if b.max_wall_s else ""),
             f"  kernel: {row['kernel'] or '-'}", f"  log: {path}"]
    for s in data["steps"]:
        what = ", ".join(s["tools"]) or "no tool call"
        evals = "; ".join(s["evaluations"])
        lines.append(f"  step {s['step']}: {what}" + (f" -> {evals}" if evals else ""))
    return "\n".join(lines), data
