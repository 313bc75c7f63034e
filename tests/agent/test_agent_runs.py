"""Many sessions for pass@k (issue 14, section 5): `epiforge generate --runs N --concurrency C`,
through the CLI and the real SDKs against the loopback servers (a test taking `sdk` runs once
through each SDK, the others through anthropic's)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from loopback import Fail, Loopback, Reply
from scenarios import K1_GOOD, K1_OFF_BY_2PCT

from epiforge import cli as epiforge
from epiforge.agent.session import read_events
from epiforge.eval.kernel import GENERATED_DIR, REPO

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

PRICED = "claude-sonnet-4-5-loopback"  # priced by the table as claude-sonnet-4
FAST = ["--no-compile", "--device", "cpu"]


class Sessions:
    """A scripted model for sessions side by side: the n-th session to send its first request
    is answered by plans[n]. It counts the requests in flight at once; the first two sessions'
    first requests wait (up to 30 s) until two have been in flight together, so that runs
    which really overlap are seen to."""

    def __init__(self, *plans):
        self.plans, self.started = plans, 0
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Condition()

    def __call__(self, body):
        with self.lock:
            asked = [m for m in body["messages"] if m["role"] != "system"]  # openai's system prompt is a message
            assert len(asked) == 1, "a later turn: none is planned"
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.lock.notify_all()
            n, self.started = self.started, self.started + 1
            if n < 2:
                self.lock.wait_for(lambda: self.most_in_flight >= 2, timeout=30)
            self.in_flight -= 1
        return self.plans[n]


def submits(source):
    return Reply("writing and submitting", [("write_kernel", {"source": source}), ("submit", {})])


def _generate(capsys, *argv):
    rc = epiforge.main(["generate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_three_runs_two_at_a_time_one_passes(tmp_path, sdk, capsys):
    logs = tmp_path / "runs"
    before = sorted(GENERATED_DIR.rglob("*.py"))
    model = Sessions(submits(K1_GOOD), submits(K1_OFF_BY_2PCT.replace("1.02", "1.03")), submits(K1_OFF_BY_2PCT))
    with Loopback(sdk.name, model, model=sdk.model) as server:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", sdk.name, "--model", sdk.model, "--base-url",
                                 server.url, "--runs", "3", "--concurrency", "2", "--max-turns", "1",
                                 "--log-dir", str(logs), "--json", *FAST)
    assert rc == 0, err
    rep = json.loads(out)  # stdout is the one JSON object and nothing else
    assert model.started == 3 and len(server.requests) == 3
    assert model.most_in_flight == 2  # two sessions at once, never three
    assert (rep["n"], rep["passed"]) == (3, 1)
    assert rep["pass_at_k"]["1"] == pytest.approx(1 / 3) and rep["pass_at_k"]["2"] == pytest.approx(2 / 3)
    assert rep["pass_at_k"]["3"] == 1.0 and sorted(rep["pass_at_k"]) == ["1", "2", "3"]
    rows = rep["runs"]
    assert [r["run"] for r in rows] == [1, 2, 3]
    assert sorted(r["outcome"] for r in rows) == ["budget_exhausted", "budget_exhausted", "passed"]
    # each run is its own session: its own id, log, workspace; the passing one its own kernel
    assert len({r["session"] for r in rows}) == 3
    assert sorted(p.name for p in logs.glob("*.jsonl")) == sorted(f"{r['session']}.jsonl" for r in rows)
    for r in rows:
        events, _ = read_events(logs / f"{r['session']}.jsonl")
        assert events[0].session == r["session"] and events[-1].outcome == r["outcome"]
        assert [(e.purpose, e.outcome) for e in events if e.event == "evaluation"] == [
            ("submit", "PASSED" if r["outcome"] == "passed" else "INCORRECT_NUMERICS")]
        assert r["turns"] == 1 and r["tokens"] > 0 and r["cost_usd"] > 0
        assert (logs / "workspaces" / r["session"] / "kernel.py").is_file()
    (passed,) = [r for r in rows if r["outcome"] == "passed"]
    assert passed["kernel"].startswith(str(logs / "generated_kernels")) and os.path.isfile(passed["kernel"])
    assert all(r["kernel"] is None for r in rows if r is not passed)
    assert rep["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rows)) and rep["to_resume"] == []
    assert sorted(GENERATED_DIR.rglob("*.py")) == before  # told to write elsewhere: nothing in the repository
    for i, r in enumerate(rows, 1):  # progress goes to stderr, each line tagged with its run
        assert f"[run {i}/3] session {r['session']}: k1_gemm_rmsnorm with {sdk.name} / {sdk.model}; log " in err

    from epiforge.eval.leaderboard import agent_rows

    (board,) = agent_rows([logs])  # the leaderboard reads the same pass@k from the logs
    assert board.pass_at(1) == pytest.approx(rep["pass_at_k"]["1"])


def test_an_outage_in_one_run_does_not_stop_the_others_and_its_log_resumes(tmp_path, anthropic_key, capsys):
    logs = tmp_path / "runs"
    quiet = Reply("thinking it over")
    model = Sessions(Fail(529, "overloaded_error"), quiet, quiet)  # no retries: the first run ends on its outage
    with Loopback("anthropic", model, model=PRICED) as server:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", PRICED, "--base-url",
                                 server.url, "--runs", "3", "--concurrency", "2", "--max-turns", "1",
                                 "--max-retries", "0", "--log-dir", str(logs), *FAST)
    assert rc == 2 and "Traceback" not in err
    assert model.started == 3  # the third run started after the outage ended the first
    assert out.startswith(f"runs: 3 sessions of k1_gemm_rmsnorm with anthropic / {PRICED}, at most 2 at a time; "
                          "the budgets apply to each run")
    lines = out[out.index("\n3 runs of ") + 1:].splitlines()  # the summary, after the progress lines
    assert lines[0] == f"3 runs of k1_gemm_rmsnorm with anthropic / {PRICED}: 0 passed, 1 ended by a backend error"
    table = {line.split()[1]: line.split() for line in lines[2:5]}
    assert sorted(row[2] for row in table.values()) == ["backend_error", "budget_exhausted", "budget_exhausted"]
    # the outage says nothing of the model: pass@k is over the two runs that ended on their own
    assert "pass@1 = 0.000  pass@2 = 0.000  (unbiased estimator over the 2 finished runs" in out
    assert "pass@3" not in out and "1 run(s) not counted (unfinished, or ended by a backend error)" in out
    (broken,) = [s for s, row in table.items() if row[2] == "backend_error"]
    log = logs / f"{broken}.jsonl"
    assert lines[-1] == f"  epiforge generate --resume {log}" and lines[-2].endswith("each continues with:")
    assert err.strip().splitlines()[-1] == ("epiforge: 1 of 3 runs did not finish: continue each with "
                                            f"epiforge generate --resume {log}")
    assert "HTTP 529 overloaded_error" in read_events(log)[0][-1].reason

    with Loopback("anthropic", [submits(K1_GOOD)], model=PRICED) as up:
        rc, out, err = _generate(capsys, "--resume", str(log), "--base-url", up.url)
    assert rc == 0, err
    events, _ = read_events(log)
    assert [e.outcome for e in events if e.event == "session_ended"] == ["backend_error", "passed"]


def test_ctrl_c_leaves_every_started_run_resumable(tmp_path, anthropic_key, capsys, ctrl_c_reaches_children):
    logs = tmp_path / "runs"
    hold = threading.Event()
    model = lambda body: (hold.wait(60), Reply("too late"))[1]  # noqa: E731  (the model never answers in time)
    with Loopback("anthropic", model, model=PRICED) as server:
        env = os.environ | {"PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-m", "epiforge", "generate", "--task", "k1", "--backend", "anthropic",
                                 "--model", PRICED, "--base-url", server.url, "--runs", "3", "--concurrency", "2",
                                 "--log-dir", str(logs), *FAST], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None and len(server.requests) < 2:
                time.sleep(0.05)
            assert len(server.requests) == 2, proc.stderr.read() if proc.poll() is not None else "no requests"
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
            out, err = proc.communicate(timeout=60)
        finally:
            hold.set()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "epiforge: interrupted" and "Traceback" not in err
    out = out[out.index("\n3 runs of ") + 1:]  # the summary, after the progress lines
    assert "(interrupted by Ctrl-C)" in out.splitlines()[0]
    started = sorted(logs.glob("*.jsonl"))
    assert len(started) == 2  # the third run never started
    assert sorted(line.split()[2] for line in out.splitlines()[2:5]) == ["not_started", "unfinished", "unfinished"]
    for log in started:
        assert f"  epiforge generate --resume {log}" in out.splitlines()
        events, _ = read_events(log)
        assert events[-1].event == "model_request" and not any(e.event == "session_ended" for e in events)
        with Loopback("anthropic", [Reply("nothing"), Reply("nothing")], model=PRICED) as server:
            rc, _, err = _generate(capsys, "--resume", str(log), "--base-url", server.url)
        assert rc == 1, err  # resumed, and ended as this model's sessions do: given up
        events, _ = read_events(log)
        assert [e.event for e in events if e.event in ("session_resumed", "session_ended")] == [
            "session_resumed", "session_ended"]
        assert events[-1].outcome == "gave_up" and events[-1].totals.turns == 2


@pytest.mark.parametrize("flags, line", [
    (["--runs", "0"], "--runs must be at least 1 (got 0)"),
    (["--runs", "2", "--concurrency", "0"], "--concurrency must be at least 1 (got 0)"),
    (["--concurrency", "2"], "--concurrency goes with --runs N"),
    (["--runs", "2", "--workspace", "ws"], "--workspace names one session's folder; with --runs each run gets "
                                           "DATA/workspaces/ID (LOG_DIR/workspaces/ID for a --log-dir outside the "
                                           "repository and DATA)"),
    (["--runs", "2", "--budget-usd", "0"], "--budget-usd must be more than 0 (got 0)"),
])
def test_bad_runs_flags_are_one_line_and_leave_no_log(tmp_path, anthropic_key, capsys, flags, line):
    rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--base-url", "http://127.0.0.1:9",
                             "--log-dir", str(tmp_path), *flags)
    assert rc == 2 and err.strip().splitlines() == [f"epiforge: {line}"] and out == ""
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_raises_is_reported_and_the_others_finish(tmp_path, anthropic_key, said):
    from epiforge.agent.backends import RetryPolicy, make_backend
    from epiforge.agent.runs import run_sessions
    from epiforge.agent.session import Budget, SessionConfig

    config = SessionConfig(task="k1", backend="anthropic", model=PRICED, compile=False, device="cpu",
                           budget=Budget(max_turns=1))
    made = []
    with Loopback("anthropic", lambda body: Reply("nothing yet"), model=PRICED) as server:
        def backend(note):
            made.append(note)
            if len(made) == 2:
                raise RuntimeError("a backend that cannot be made\nsecond line")
            return make_backend("anthropic", model=PRICED, base_url=server.url, retry=RetryPolicy(max_retries=0))

        rep = run_sessions(config, backend, runs=3, concurrency=1, log_dir=tmp_path / "logs", out_dir=tmp_path / "gen",
                           say=said.say)
    assert [r["outcome"] for r in rep["runs"]] == ["budget_exhausted", "error", "budget_exhausted"]
    assert rep["runs"][1]["reason"] == "a backend that cannot be made" and rep["runs"][1]["log"] is None
    assert "[run 2/3] failed: a backend that cannot be made" in said
    assert len(server.requests) == 2 and len(list((tmp_path / "logs").glob("*.jsonl"))) == 2
    # the run with no session is not counted: pass@k over the 2 that finished (agent/sessions.py counts_as_pass)
    assert (rep["n"], rep["unfinished"], rep["runs"][1]["pass"]) == (2, 1, None)
    assert rep["pass_at_k"] == {"1": 0.0, "2": 0.0} and rep["to_resume"] == [] and not rep["interrupted"]


def test_a_session_whose_budget_ran_out_before_the_model_answered_is_not_counted():
    """pass@k measures the model: a session that never got an answer (0 turns) says nothing
    of it, whatever spent its budget; one that ran out after answering is a failure."""
    from epiforge.agent.session import SessionEnded, Totals
    from epiforge.agent.sessions import counts_as_pass

    def end(outcome, turns):
        return SessionEnded(session="s", outcome=outcome, reason="r", totals=Totals(turns=turns))

    assert counts_as_pass(end("budget_exhausted", 0)) is None
    assert counts_as_pass(end("budget_exhausted", 1)) is False
    assert counts_as_pass(end("gave_up", 0)) is False
    assert counts_as_pass(end("passed", 3)) is True
    assert counts_as_pass(end("backend_error", 2)) is None
