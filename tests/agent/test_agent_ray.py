"""`generate --runs N --ray`: the runs as Ray tasks on a local cluster (agent/runs.py), a
scripted agent CLI through the command backend, one worker killed mid-session: its run is
retried and resumes its session from its log, and every run ends exactly once."""

import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'epiforge[ray]')")
pytestmark = pytest.mark.spawns  # Ray's processes, the agent CLI, each evaluation's judge

FAKE = Path(__file__).resolve().parent / "fake_agent.py"


def _kill_one_worker(progress: Path, logs: Path, stop: threading.Event, killed: list) -> None:
    """SIGKILL the worker of the first session seen to start, once its log has begun."""
    while not stop.is_set():
        marks = sorted(progress.iterdir())
        if marks:
            session, pid = marks[0].name.rsplit(".", 1)
            while not stop.is_set() and not (logs / f"{session}.jsonl").is_file():
                time.sleep(0.05)
            time.sleep(0.3)  # into the session: the agent CLI or its evaluation
            os.kill(int(pid), signal.SIGKILL)
            killed.append(session)
            return
        time.sleep(0.05)


def test_eight_runs_on_ray_survive_a_killed_worker(tmp_path, monkeypatch):
    from epiforge.agent.backends import make_backend
    from epiforge.agent.runs import run_sessions
    from epiforge.agent.sandbox import available
    from epiforge.agent.session import Budget, SessionConfig, SessionResumed, read_events
    from epiforge.eval.cluster import PROGRESS_DIR_ENV

    progress = tmp_path / "progress"
    progress.mkdir()
    monkeypatch.setenv(PROGRESS_DIR_ENV, str(progress))
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} --right-first --no-check"
    sandbox = available()[0]
    config = SessionConfig(task="k1", backend="command", model="scripted-fake-agent", command=command, compile=False,
                           device="cpu", budget=Budget(max_turns=3), sandbox=sandbox, sandbox_expose=[str(FAKE.parent)])

    def backend(note):
        return make_backend("command", command=command, model="scripted-fake-agent", sandbox=sandbox,
                            sandbox_expose=[str(FAKE.parent)], note=note)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    stop, killed, said = threading.Event(), [], []
    watcher = threading.Thread(target=_kill_one_worker, args=(progress, tmp_path / "logs", stop, killed))
    watcher.start()
    try:
        rep = run_sessions(config, backend, runs=8, log_dir=tmp_path / "logs", out_dir=tmp_path / "gen",
                           say=said.append, ray="local")
    finally:
        stop.set()
        watcher.join()
        ray.shutdown()
    assert killed, "the watcher never saw a session start"
    assert not rep["interrupted"] and len(rep["runs"]) == 8
    assert [r["outcome"] for r in rep["runs"]] == ["passed"] * 8, rep["runs"]
    assert rep["n"] == rep["passed"] == 8 and rep["pass_at_k"]["1"] == 1.0
    logs = sorted((tmp_path / "logs").glob("*.jsonl"))
    assert len(logs) == 8 and {p.stem for p in logs} == {r["session"] for r in rep["runs"]}
    assert len(list((tmp_path / "gen").rglob("*.py"))) == 8  # one passing kernel a run, none twice
    resumed = [p.stem for p in logs if any(isinstance(e, SessionResumed) for e in read_events(p)[0])]
    starts = {p.stem: len(list(progress.glob(f"{p.stem}.*"))) for p in logs}
    assert starts[killed[0]] == 2 and all(n == 1 for s, n in starts.items() if s != killed[0])  # retried once
    assert resumed == killed  # the retry continued the killed session's own log


@pytest.mark.parametrize("argv,line", [
    (["generate", "--task", "k1", "--backend", "command", "--command", "x", "--ray"], "--ray goes with --runs N"),
    (["generate", "--task", "k1", "--backend", "command", "--command", "x", "--runs", "2", "--concurrency", "2",
      "--ray"], "--concurrency is for runs on this machine; on --ray the cluster's CPUs decide"),
    (["ablate", "--task", "k1", "--backend", "command", "--command", "x", "--pack-without", "pitfalls",
      "--concurrency", "2", "--ray"], "--concurrency is for sessions on this machine; on --ray the cluster's CPUs decide"),
])
def test_ray_options_that_do_not_go_together_are_one_line(argv, line, capsys):
    from epiforge import cli

    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"epiforge: {line}"
