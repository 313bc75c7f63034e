"""Knowledge-pack ablations: the same task and backend, run repeatedly with the full pack and
without each named page, then a report of success rate, turns, tokens and cost per condition.

The report is computed from session logs alone (each records the pages it was run
without), so logs of earlier runs can be pooled: `epiforge ablate --from-logs DIR`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean
from typing import Callable

from epiforge.agent.session import LogError, SessionConfig, SessionEnded, read_events

FULL = "(full pack)"
_PASSED = ("passed", "passed_slow")


@dataclass
class Row:
    task: str
    without: str  # FULL or the page left out (pages joined by '+')
    runs: int
    passed: int
    success_rate: float
    mean_turns: float
    mean_tokens: float
    mean_cost_usd: float | None  # None when any run was unpriced
    delta_success: float | None = None  # against the full pack of the same task
    delta_turns: float | None = None


def run_ablation(config: SessionConfig, make_backend: Callable[[], object], *, pages: list[str], runs: int, log_dir: Path,
                 docs_dir: Path | None = None, say: Callable[[str], None] = print, concurrency: int = 1,
                 ray: str | None = None) -> list[Path]:
    """`runs` sessions with the full pack, then `runs` without each page, at most `concurrency`
    at a time (agent/runs.py run_pool, as `generate --runs`: a run that fails is its own and
    the others go on; Ctrl-C stops them all), or on a Ray cluster (`ray`: its address, or
    "local"; run_pool's); returns the logs there are, in that order."""
    from epiforge.agent.loop import ScreenWatch, config_problem
    from epiforge.agent.pack import build_pack
    from epiforge.agent.runs import run_pool
    from epiforge.agent.session import ConfigError
    from epiforge import tasks

    task = tasks.get_task(config.task)
    config = config.model_copy(update={"task": task.name})
    problem = config_problem(config)  # one line now, not the same failure in every run
    if problem:
        raise ConfigError(problem)
    from epiforge.agent.runs import check_folders

    check_folders(log_dir, None)  # before the screening and the announcement: a bad --log-dir costs nothing
    with ScreenWatch(say, task.id, None) as watch:  # the verdicts cached once, before the sessions share them
        for page in pages:  # an unknown page fails now, before any session is spent
            build_pack(task, docs_dir, [page], watch=watch)
        build_pack(task, docs_dir, [], watch=watch)
    conditions = [[], *[[p] for p in pages]]
    configs = [config.model_copy(update={"pack_without": without}) for without in conditions for _ in range(runs)]
    tags = [f"[{'without ' + without[0] if without else FULL}, run {i + 1} of {runs}] "
            for without in conditions for i in range(runs)]
    say(f"ablation: {len(configs)} sessions of {task.name} ({runs} per condition: {FULL}"
        + "".join(f", without {p}" for p in pages)
        + (f"), on the Ray cluster ({ray})" if ray else f"), at most {concurrency} at a time") + f"; logs in {log_dir}")
    done, interrupted = run_pool(configs, lambda note: make_backend(), concurrency=concurrency, log_dir=log_dir,
                                 out_dir=None, docs_dir=docs_dir, say=say, tags=tags, ray=ray)
    if interrupted:
        say("ablation: interrupted by Ctrl-C; the report covers the sessions that finished")
    return [r.log for r in done if r.log.is_file()]


def report(log_paths: list[Path], warn: Callable[[str], None] = print) -> list[Row]:
    """One row per (task, pages left out), from the logs of finished sessions."""
    groups: dict[tuple[str, str], list[SessionEnded]] = {}
    for path in log_paths:
        try:
            events, warnings = read_events(path)
        except LogError as e:  # one unreadable file among the logs: say so, report the others
            warn(f"warning: {str(e).splitlines()[0]}; left out of the report")
            continue
        for w in warnings:
            warn(f"warning: {w}")
        end = next((e for e in reversed(events) if isinstance(e, SessionEnded)), None)
        if end is None:
            warn(f"warning: {path}: the session did not finish; left out of the report")
            continue
        start = events[0]
        key = (start.config.task, "+".join(start.pack.without) or FULL)
        groups.setdefault(key, []).append(end)
    rows = []
    for (task, without), ends in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != FULL, kv[0][1])):
        costs = [e.totals.cost_usd for e in ends]
        passed = sum(e.outcome in _PASSED for e in ends)
        rows.append(Row(task=task, without=without, runs=len(ends), passed=passed, success_rate=round(passed / len(ends), 3),
                        mean_turns=round(mean(e.totals.turns for e in ends), 2),
                        mean_tokens=round(mean(e.totals.usage.total for e in ends), 1),
                        mean_cost_usd=None if None in costs else round(mean(costs), 6)))
    full = {r.task: r for r in rows if r.without == FULL}
    for r in rows:
        base = full.get(r.task)
        if base is not None and r is not base:
            r.delta_success = round(r.success_rate - base.success_rate, 3)
            r.delta_turns = round(r.mean_turns - base.mean_turns, 2)
    return rows


def print_report(rows: list[Row]) -> None:
    from epiforge.cli import console
    from rich.table import Table

    table = Table(title="knowledge-pack ablation")
    for col in ("task", "without", "runs", "success", "d success", "turns", "d turns", "tokens", "cost"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.task, r.without, str(r.runs), f"{r.passed}/{r.runs} ({r.success_rate:.0%})",
                      "" if r.delta_success is None else f"{r.delta_success:+.0%}", f"{r.mean_turns:.1f}",
                      "" if r.delta_turns is None else f"{r.delta_turns:+.1f}", f"{r.mean_tokens:.0f}",
                      "unpriced" if r.mean_cost_usd is None else f"${r.mean_cost_usd:.4f}")
    console().print(table)


def rows_json(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]
