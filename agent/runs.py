"""Many sessions of one task, for pass@k: `epiforge generate --runs N --concurrency C`.

    report = run_sessions(config, make_backend, runs=3, concurrency=2, log_dir=..., say=print)

Each run is a full, normal session (agent.loop.run_session): its own backend, session id,
log, workspace, kernel and budgets. At most `concurrency` run at once, each in a thread of
its own (a session mostly waits: on the model's server, on the evaluator's subprocesses). A
run that fails (a backend outage past its retries, an exception) ends that run only; the
others go on. Ctrl-C stops every run where it is: a cut-off run's log is a killed session's,
and `epiforge generate --resume LOG` continues it (as it does one that ended on a backend
error). The report says, per run, its session, outcome, turns, tokens and dollars, and
pass@k over the runs that finished (the unbiased estimator, eval/leaderboard.py's pass_at_k;
which sessions count is agent/sessions.py's counts_as_pass, the leaderboard's rule too: an
unfinished run, or one ended by a backend error, is not counted, and the report says how
many were left out).

run_pool is the part that runs sessions side by side; `epiforge ablate` (agent/ablate.py)
runs its conditions through it too. With `ray` (an address, or "local"), each run is a Ray
task on a worker of a cluster instead of a thread here (run_pool_on_ray): the log and the
workspace go where this machine says (log_dir: storage every node sees), and a run whose
worker died is retried by Ray, resuming its session from its log (resume_session) rather
than starting it again; a retry that finds its session ended only reports it.
"""

from __future__ import annotations

import queue
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from epiforge.agent.session import SessionConfig, new_session_id
from epiforge.agent.sessions import PASSED  # noqa: F401 (re-exported: what counts as a pass)
from epiforge.text import counted

#: outcomes whose log `generate --resume` continues
RESUMABLE = ("backend_error", "unfinished")


@dataclass
class Run:
    index: int  # 1..N
    session: str
    log: Path
    config: SessionConfig | None = None  # this run's configuration
    tag: str = ""  # what its progress lines start with
    error: str | None = None  # the exception that ended this run's thread, in one line

    def row(self) -> dict:
        """What the run's log says (agent/sessions.py's row), or why there is no log."""
        from epiforge.agent.sessions import summarize

        started = self.log.is_file() or self.error is not None
        row = summarize(self.log) if self.log.is_file() else "Ctrl-C came before it started"
        if isinstance(row, str):  # no usable log
            row = {"session": self.session, "outcome": "error" if started else "not_started", "reason": row,
                   "turns": 0, "tokens": 0, "cost_usd": None, "kernel": None, "pass": None, "log": None}
        if self.error:
            row |= {"outcome": "error" if row["outcome"] in ("not_started", "unfinished") else row["outcome"],
                    "reason": self.error}
        keep = ("session", "outcome", "reason", "turns", "tokens", "cost_usd", "kernel", "pass", "log")
        return {"run": self.index} | {k: row[k] for k in keep}


def run_sessions(config: SessionConfig, make_backend: Callable[[Callable[[str], None]], object], *, runs: int,
                 concurrency: int = 1, log_dir: Path, out_dir: Path | None, docs_dir: Path | None = None,
                 say: Callable[[str], None] = print, note: Callable[[str], None] | None = None,
                 ray: str | None = None) -> dict:
    """Run `runs` sessions of `config`, at most `concurrency` at a time; `make_backend(tell)`
    gives each run a fresh backend (`tell`: where it reports retries, the run's tagged `say`).
    Returns the report (`report()`), with "interrupted" true when Ctrl-C cut the runs short.
    `note`: where the pack's screening says how it goes (default: `say`), before the runs and
    in each."""
    from epiforge import tasks
    from epiforge.agent.loop import ScreenWatch
    from epiforge.agent.pack import build_pack

    task = tasks.get_task(config.task)
    config = config.model_copy(update={"task": task.name})
    check_folders(log_dir, out_dir)  # before the screening: a bad folder costs nothing
    # the pack's verdicts cached once, before the runs share them; no longer than one run's wall-time budget (a run
    # screens what is left within its own)
    with ScreenWatch(note or say, task.id, config.budget.max_wall_s) as watch:
        build_pack(task, docs_dir, config.pack_without, watch=watch)
    where = f"on the Ray cluster ({ray})" if ray else f"at most {concurrency} at a time"
    say(f"runs: {runs} sessions of {task.name} with {config.backend} / {config.model}, {where}; the budgets apply "
        f"to each run; logs in {log_dir}")
    all_runs, interrupted = run_pool([config] * runs, make_backend, concurrency=concurrency, log_dir=log_dir,
                                     out_dir=out_dir, docs_dir=docs_dir, say=say, note=note, ray=ray)
    return report(config, [r.row() for r in all_runs], interrupted=interrupted)


def run_pool(configs: list[SessionConfig], make_backend: Callable[[Callable[[str], None]], object], *,
             concurrency: int = 1, log_dir: Path, out_dir: Path | None, docs_dir: Path | None = None,
             say: Callable[[str], None] = print, tags: list[str] | None = None,
             note: Callable[[str], None] | None = None, ray: str | None = None) -> tuple[list[Run], bool]:
    """One session per configuration, in order, at most `concurrency` at a time, each in a
    thread of its own with a fresh backend (`make_backend(tell)`, as run_sessions') and a
    session id of its own; `tags[i]`: what run i's progress lines start with (default
    "[run i/N] "); `note`: where each run's screening of the pack says how it goes, tagged too
    (default: `say`). A run's failure (an exception) is its own: the others go on. Returns the
    runs and whether Ctrl-C cut them short. ray: run them on a Ray cluster (module docstring;
    `concurrency` then does not apply: the cluster's CPUs decide)."""
    from epiforge import tasks
    from epiforge.agent.loop import beside, run_session

    check_folders(log_dir, out_dir)  # else every run would fail on its own
    runs = len(configs)
    ids: list[str] = []
    while len(ids) < runs:
        sid = new_session_id(tasks.get_task(configs[len(ids)].task).id)
        if sid not in ids:
            ids.append(sid)
    all_runs = [Run(i + 1, sid, Path(log_dir) / f"{sid}.jsonl", config=c,
                    tag=tags[i] if tags else f"[run {i + 1}/{runs}] ") for i, (sid, c) in enumerate(zip(ids, configs))]
    if ray is not None:
        return all_runs, run_pool_on_ray(all_runs, make_backend, address=None if ray == "local" else ray,
                                         log_dir=log_dir, out_dir=out_dir, docs_dir=docs_dir, say=say)
    todo: queue.SimpleQueue[Run] = queue.SimpleQueue()
    for run in all_runs:
        todo.put(run)
    # After Ctrl-C the runs' threads live on until the process exits: they print nothing more
    lock, quiet = threading.Lock(), threading.Event()

    def tell(line: str, to: Callable[[str], None] = say) -> None:
        with lock:
            if not quiet.is_set():
                to(line)

    def one(run: Run) -> None:
        said = lambda line: tell(run.tag + line)  # noqa: E731
        backend = None
        try:
            backend = make_backend(said)
            run_session(run.config, backend, log_dir=log_dir, session_id=run.session, out_dir=out_dir,
                        docs_dir=docs_dir, say=said, workspaces=beside(log_dir, "workspaces"),
                        note=lambda line: tell(run.tag + line, note or say))
        except Exception as e:  # this run's failure is its own: the others go on
            run.error = (str(e).splitlines() or [type(e).__name__])[0]
            said(f"failed: {run.error}")
        finally:
            if backend is not None:
                backend.close()

    def worker() -> None:
        while not quiet.is_set():
            try:
                run = todo.get_nowait()
            except queue.Empty:
                return
            one(run)

    threads = [threading.Thread(target=worker, daemon=True, name=f"run-{i}") for i in range(min(concurrency, runs))]
    for t in threads:
        t.start()
    interrupted = False
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        with lock:
            quiet.set()
        interrupted = True
    return all_runs, interrupted


def _session_on_worker(run: Run, make_backend, log_dir: Path, out_dir: Path | None, docs_dir: Path | None) -> dict:
    """On a Ray worker: the run's session, or (a retry: the log is there) its resumption.
    Returns what it said and the error that ended it, if any."""
    from epiforge.agent.loop import beside, resume_session, run_session
    from epiforge.agent.session import read_events
    from epiforge.agent.transcript import rebuild
    from epiforge.eval.cluster import mark_started

    mark_started(run.session)
    lines: list[str] = []
    backend = None
    try:
        if run.log.is_file() and run.log.stat().st_size:
            ended = rebuild(read_events(run.log)[0]).ended
            if ended is not None and ended.outcome != "backend_error":
                return {"lines": [f"session {run.session}: already ended ({ended.outcome})"], "error": None}
            backend = make_backend(lines.append)
            resume_session(run.log, backend, config=run.config, out_dir=out_dir, docs_dir=docs_dir, say=lines.append)
        else:
            backend = make_backend(lines.append)
            run_session(run.config, backend, log_dir=log_dir, session_id=run.session, out_dir=out_dir,
                        docs_dir=docs_dir, say=lines.append, workspaces=beside(log_dir, "workspaces"))
        return {"lines": lines, "error": None}
    except Exception as e:  # this run's failure is its own: the others go on
        return {"lines": lines, "error": (str(e).splitlines() or [type(e).__name__])[0]}
    finally:
        if backend is not None:
            backend.close()


def run_pool_on_ray(all_runs: list[Run], make_backend, *, address: str | None, log_dir: Path,
                    out_dir: Path | None, docs_dir: Path | None, say: Callable[[str], None]) -> bool:
    """The runs as Ray tasks (one CPU each; eval/cluster.py on_ray), each run's lines said
    when it ends; returns whether Ctrl-C cut them short. address: a running cluster's, None:
    a local one started here for these runs."""
    from epiforge.eval.cluster import on_ray

    def heard(i: int, got: dict | None, error: str | None) -> None:
        run = all_runs[i]
        got = got or {"lines": [], "error": f"the cluster lost this run: {error}"}
        for line in got["lines"]:
            say(run.tag + line)
        if got["error"]:
            run.error = got["error"]
            say(f"{run.tag}failed: {run.error}")

    try:
        on_ray(_session_on_worker, [(run, make_backend, Path(log_dir), out_dir, docs_dir) for run in all_runs],
               address=address, resources={"num_cpus": 1}, on_result=heard)
    except KeyboardInterrupt:
        return True
    return False


def check_folders(log_dir: Path, out_dir: Path | None) -> None:
    """Raise ConfigError (one line) when the runs cannot write their logs, workspaces or kernels."""
    from epiforge.agent.loop import beside, folders_problem
    from epiforge.agent.session import ConfigError

    problem = folders_problem(log_dir=log_dir, workspace=beside(log_dir, "workspaces"), out_dir=out_dir)
    if problem:
        raise ConfigError(problem)


def report(config: SessionConfig, rows: list[dict], *, interrupted: bool = False) -> dict:
    """The runs' rows, their totals and pass@k for k = 1..n over the n runs that count: a
    row's "pass" (agent/sessions.py counts_as_pass, the leaderboard's rule) is None for an
    unfinished run (no end: killed, cut off, or failed before its log began) and for one
    ended by a backend error, neither counted; "not_counted" says how many were left out,
    "unfinished" how many of them never ended."""
    from epiforge.eval.leaderboard import pass_at_k

    counted = [r["pass"] for r in rows if r["pass"] is not None]
    n, c = len(counted), sum(counted)
    costs = [r["cost_usd"] for r in rows if r["turns"]]
    return {"task": config.task, "backend": config.backend, "model": config.model, "runs": rows, "n": n, "passed": c,
            "not_counted": len(rows) - n,
            "unfinished": sum(r["pass"] is None and r["outcome"] != "backend_error" for r in rows), "pass_at_k": {str(k): pass_at_k(n, c, k) for k in range(1, n + 1)},
            "turns": sum(r["turns"] for r in rows), "tokens": sum(r["tokens"] for r in rows),
            "cost_usd": None if None in costs else round(sum(costs), 6),
            "to_resume": [r["log"] for r in rows if r["log"] and r["outcome"] in RESUMABLE + ("error",)],
            "interrupted": interrupted}


def shown_ks(n: int) -> list[int]:
    """The k a person is shown: every k up to 10, then 1, 2, 5, 10, 20, 50, ... and N."""
    if n <= 10:
        return list(range(1, n + 1))
    return sorted({k for k in (1, 2, 5, 10, 20, 50, 100, 200, 500) if k < n} | {n})


def render(rep: dict) -> str:
    total = len(rep["runs"])
    outage = rep["not_counted"] - rep["unfinished"]
    lines = [f"{total} runs of {rep['task']} with {rep['backend']} / {rep['model']}: {rep['passed']} passed"
             + (f", {rep['unfinished']} unfinished" if rep["unfinished"] else "")
             + (f", {outage} ended by a backend error" if outage else "")
             + (" (interrupted by Ctrl-C)" if rep["interrupted"] else ""),
             f"{'run':>4}  {'session':34} {'outcome':19} {'turns':>5} {'tokens':>9} {'$':>8}  kernel"]
    for r in rep["runs"]:
        cost = "unpriced" if r["cost_usd"] is None else f"{r['cost_usd']:.4f}"
        lines.append(f"{r['run']:>4}  {r['session']:34} {r['outcome']:19} {r['turns']:>5} {r['tokens']:>9} "
                     f"{cost:>8}  {r['kernel'] or '-'}")
    left = (f"; {rep['not_counted']} run(s) not counted (unfinished, or ended by a backend error)"
            if rep["not_counted"] else "")
    if rep["n"]:
        lines.append("  ".join(f"pass@{k} = {rep['pass_at_k'][str(k)]:.3f}" for k in shown_ks(rep["n"]))
                     + f"  (unbiased estimator over the {rep['n']} finished runs, a finished run that did not pass "
                       f"counted as failed{left})")
    else:
        lines.append(f"pass@k: no run finished{left}")
    cost = "unpriced" if rep["cost_usd"] is None else f"${rep['cost_usd']:.4f}"
    lines.append(f"total: {counted(rep['turns'], 'turn')}, {rep['tokens']:,} tokens, {cost}")
    if rep["to_resume"]:
        lines.append(f"{len(rep['to_resume'])} run(s) did not finish (a backend error, an error or Ctrl-C); "
                     "each continues with:")
        lines += [f"  epiforge generate --resume {shlex.quote(str(log))}" for log in rep["to_resume"]]
    return "\n".join(lines)
