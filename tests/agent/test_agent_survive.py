"""Sessions that survive outages and kills, and budgets that hold (issue 14, sections 1-2),
through the CLI and the real SDKs against the loopback servers (the tests taking `sdk` run
once through each SDK, the others through anthropic's)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from loopback import Fail, Loopback, Reply, last_tool_results
from scenarios import K1_GOOD, K1_HANGS

from epiforge import cli as epiforge
from epiforge.agent.backends import RetryPolicy, make_backend
from epiforge.agent.loop import run_session
from epiforge.agent.session import ApiRetry, Budget, ModelRequest, SessionConfig, read_events
from epiforge.agent.tools import check_timeout_s
from epiforge.eval.kernel import GENERATED_DIR, REPO

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

PRICED = "claude-sonnet-4-5-loopback"  # the table prices it as claude-sonnet-4 ($3 in, $15 out per MTok)
FAST = ["--no-compile", "--device", "cpu"]


def _config(model=PRICED, backend="anthropic", **budget):
    return SessionConfig(task="k1", backend=backend, model=model, compile=False, device="cpu",
                         budget=Budget(**({"max_turns": 8} | budget)))


def _session(tmp_path, script, said, config, retry=None):
    """A session through the real SDK of config.backend against its loopback server."""
    with Loopback(config.backend, script, model=config.model) as server:
        backend = make_backend(config.backend, model=config.model, base_url=server.url, timeout_s=10,
                               retry=retry or RetryPolicy(max_retries=2, backoff_s=0.01))
        end, log = run_session(config, backend, log_dir=tmp_path / "logs", workspace=tmp_path / "ws",
                               out_dir=tmp_path / "gen", say=said.say)
    return end, log, server


def _generate(capsys, *argv):
    rc = epiforge.main(["generate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _kernels_in_repo():
    return sorted(p.name for p in GENERATED_DIR.rglob("*.py"))


# ---- retries -------------------------------------------------------------------------------


def test_backoff_is_exponential_with_jitter_and_retry_after_is_honoured():
    policy = RetryPolicy(backoff_s=1.0, max_wait_s=8.0)
    for attempt, full in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (6, 8.0)]:
        waits = [policy.wait_s(attempt, None) for _ in range(200)]
        assert all(full / 2 <= w <= full for w in waits)
        assert max(waits) - min(waits) > full / 10  # jittered, not in step
    asked = [policy.wait_s(0, 30.0) for _ in range(50)]
    assert all(30.0 <= w <= 33.0 for w in asked)  # never less than the server's retry-after, even over max_wait_s


def test_a_retry_after_header_sets_the_wait(tmp_path, anthropic_key, said):
    script = [Fail(429, "rate_limit_error", retry_after="0.6"), Reply("nothing"), Reply("still nothing")]
    t0 = time.monotonic()
    end, log, server = _session(tmp_path, script, said, _config(), retry=RetryPolicy(max_retries=2, backoff_s=0.01))
    assert time.monotonic() - t0 >= 0.6
    (retry,) = [e for e in read_events(log)[0] if isinstance(e, ApiRetry)]
    assert 0.6 <= retry.wait_s <= 0.7 and "429" in retry.error
    assert end.outcome == "gave_up" and len(server.requests) == 3


def test_retries_stop_at_the_wall_time_budget_through_the_seam():
    from epiforge.agent.backends.base import WallTimeExhausted, with_retries

    calls, left, retried = [], [5.0], []

    def call(seconds):
        calls.append(seconds)
        left[0] -= 1.0  # each attempt takes a second of the budget
        raise RuntimeError("overloaded")

    with pytest.raises(WallTimeExhausted) as e:
        with_retries(call, lambda _: (True, "HTTP 529 overloaded_error", 0.0), RetryPolicy(max_retries=9), None,
                     time_left=lambda: left[0])
    assert calls == [5.0, 4.0, 3.0, 2.0, 1.0]  # each request capped by the time left, then none at 0 s left
    assert str(e.value) == "wall-time budget: no time left for another request after HTTP 529 overloaded_error"
    left[0], calls[:] = 2.5, []
    with pytest.raises(WallTimeExhausted) as e:  # the server asks for 2 s: one wait fits, the second does not
        with_retries(call, lambda _: (True, "HTTP 529", 2.0), RetryPolicy(max_retries=9),
                     lambda *a: retried.append(a), time_left=lambda: left[0])
    assert len(calls) == 1 and retried == [] and str(e.value).startswith("wall-time budget: 1.5 s left, less than")


def test_retries_do_not_outlast_the_wall_time_budget(tmp_path, anthropic_key, capsys):
    with Loopback("anthropic", lambda body: Fail(529, "overloaded_error", retry_after="1"), model=PRICED) as down:
        t0 = time.monotonic()
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", PRICED, "--base-url",
                                 down.url, "--max-wall-s", "2", "--log-dir", str(tmp_path), *FAST)
        elapsed = time.monotonic() - t0
        assert len(down.requests) == 2  # the first try, one retry after ~1 s; a second wait would pass 2 s
    assert rc == 1 and "Traceback" not in err
    (log,) = tmp_path.glob("*.jsonl")
    end = read_events(log)[0][-1]
    assert end.outcome == "budget_exhausted" and end.reason.startswith("wall-time budget: ")
    assert end.totals.wall_s < 2 and elapsed < 10  # the old loop: 7 requests over 6.3 s, then backend_error
    assert "less than the" in end.reason and "HTTP 529 overloaded_error" in end.reason
    assert f"budget_exhausted ({end.reason})" in out


def test_a_request_never_outlasts_the_wall_time_budget(tmp_path, sdk, said):
    from loopback import Stall

    t0 = time.monotonic()  # the client's timeout is 10 s, the stall 30 s, the budget 2 s
    end, log, server = _session(tmp_path, [Stall(30), Reply("late")], said, _config(sdk.model, sdk.name, max_wall_s=2))
    assert time.monotonic() - t0 < 8 and len(server.requests) == 1
    assert end.outcome == "budget_exhausted" and end.reason.startswith("wall-time budget")
    assert 1.5 < end.totals.wall_s < 3
    assert "timed out" in end.reason


def test_an_outage_longer_than_the_retries_then_a_resume_that_completes(tmp_path, sdk, capsys, monkeypatch):
    logs = tmp_path / "runs"
    before = _kernels_in_repo()
    with Loopback(sdk.name, lambda body: Fail(529, "overloaded_error", retry_after="0"), model=sdk.model) as down:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", sdk.name, "--model", sdk.model, "--base-url",
                                 down.url, "--max-retries", "2", "--log-dir", str(logs), *FAST)
        assert len(down.requests) == 3  # the first try and --max-retries 2
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    (log,) = logs.glob("*.jsonl")
    assert f"{sdk.name}: HTTP 529" in err and "(after 3 attempts)" in err
    assert err.rstrip().endswith(f"; the log is kept: continue with epiforge generate --resume {log}")
    assert read_events(log)[0][-1].outcome == "backend_error"

    # the service is back at another address; the environment names it, and it wins over the log
    script = [Reply("writing", [("write_kernel", {"source": K1_GOOD}), ("run_check", {})]),
              Reply("submitting", [("submit", {})])]
    with Loopback(sdk.name, script, model=sdk.model) as up:
        monkeypatch.setenv(sdk.base_url_env, up.url)
        rc, out, err = _generate(capsys, "--resume", str(log), "--max-turns", "6")
        assert len(up.requests) == 2
        # the resumed model sees the whole conversation: the prompt, nothing lost
        sent = [m for m in up.requests[0]["messages"] if m["role"] != "system"]  # openai's system prompt is one
        assert [m["role"] for m in sent] == ["user"]
    assert rc == 0, err
    assert f"base url = {up.url} (from {sdk.base_url_env}; the log had {down.url})" in out
    assert "max turns = 6 (from --max-turns; the log had 30)" in out
    assert f"model = {sdk.model} (from the log)" in out
    events, _ = read_events(log)
    resumed = next(e for e in events if e.event == "session_resumed")
    assert resumed.after_outcome == "backend_error" and resumed.from_step == 0
    assert resumed.config.base_url == up.url and resumed.config.budget.max_turns == 6
    assert [e.outcome for e in events if e.event == "session_ended"] == ["backend_error", "passed"]
    # the run was told to write elsewhere: the kernel and the workspace are beside the log
    end = events[-1]
    assert end.generated_kernel.startswith(str(logs / "generated_kernels"))
    assert (logs / "workspaces" / events[0].session / "kernel.py").read_text() == K1_GOOD
    assert _kernels_in_repo() == before

    from epiforge.eval.leaderboard import agent_rows

    (board,) = agent_rows([logs])  # the leaderboard counts the resumed session by how it ended last
    assert board.tasks == {"k1_gemm_rmsnorm": (1, 1)} and board.solved == 1

    assert epiforge.main(["sessions", "list", "--log-dir", str(logs), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["outcome"], row["turns"], row["kernel"]) == ("passed", 2, end.generated_kernel)
    assert epiforge.main(["sessions", "show", events[0].session, "--log-dir", str(logs)]) == 0
    shown = capsys.readouterr().out
    assert "outcome: passed" in shown and "step 0: write_kernel, run_check -> check cpu/smoke: PASSED" in shown


def test_an_outage_after_a_finished_step_resumes_at_the_next_step(tmp_path, sdk, capsys):
    """A session that finished a tool step, then met an outage longer than its retries,
    resumes at the step the outage cut off: the finished step is not done again."""
    logs = tmp_path / "runs"
    script = [Reply("writing", [("write_kernel", {"source": K1_GOOD}), ("run_check", {})]),
              Fail(529, "overloaded_error", retry_after="0"), Fail(529, "overloaded_error", retry_after="0")]
    with Loopback(sdk.name, script, model=sdk.model) as down:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", sdk.name, "--model", sdk.model, "--base-url",
                                 down.url, "--max-retries", "1", "--log-dir", str(logs), *FAST)
        assert len(down.requests) == 3  # step 0, then step 1 and its one retry
    assert rc == 2 and "Traceback" not in err and f"{sdk.name}: HTTP 529" in err
    (log,) = logs.glob("*.jsonl")
    failed = log.read_text()
    assert read_events(log)[0][-1].outcome == "backend_error"

    def submit_after_the_check(body):
        assert "check: PASSED" in last_tool_results(body)  # step 0's results reach the resumed model
        return Reply("submitting", [("submit", {})])

    with Loopback(sdk.name, [submit_after_the_check], model=sdk.model) as up:
        rc, out, err = _generate(capsys, "--resume", str(log), "--base-url", up.url)
        assert len(up.requests) == 1
    assert rc == 0, err
    # the resumed request is the one the outage cut off: the same conversation, step 0 in it once
    assert up.requests[0]["messages"] == down.requests[1]["messages"]
    assert log.read_text().startswith(failed)  # nothing the failed run wrote is lost or rewritten
    events, _ = read_events(log)
    resumed = next(e for e in events if e.event == "session_resumed")
    assert (resumed.from_step, resumed.after_outcome) == (1, "backend_error")
    assert "resumed at step 1 after backend_error" in out
    assert [(e.step, e.name) for e in events if e.event == "tool_called"] == [
        (0, "write_kernel"), (0, "run_check"), (1, "submit")]
    assert [(e.step, e.purpose, e.outcome) for e in events if e.event == "evaluation"] == [
        (0, "check", "PASSED"), (1, "submit", "PASSED")]
    assert [e.step for e in events if e.event == "model_response"] == [0, 1]
    end = events[-1]
    assert end.outcome == "passed" and end.totals.turns == 2
    assert (logs / "workspaces" / events[0].session / "kernel.py").read_text() == K1_GOOD


def test_a_resume_applies_and_reports_the_pack_and_backend_flags(tmp_path, anthropic_key, said, capsys):
    end, log, _ = _session(tmp_path, [Fail(401, "authentication_error")], said, _config())
    assert end.outcome == "backend_error"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Index\n\nKEPT-PAGE-MARKER\n")
    (docs / "other.md").write_text("# Other\n\nLEFT-OUT-MARKER\n")
    with Loopback("anthropic", [Reply("nothing"), Reply("nothing")], model=PRICED) as server:
        rc, out, err = _generate(capsys, "--resume", str(log), "--base-url", server.url, "--pack-without", "other",
                                 "--docs-dir", str(docs), "--max-retries", "3", "--timeout", "30", "--no-stream")
    assert rc == 1, err
    system = json.dumps(server.requests[0]["system"])
    assert "KEPT-PAGE-MARKER" in system and "LEFT-OUT-MARKER" not in system
    assert not server.requests[0].get("stream")
    assert "resume: pack without = ['other'] (from --pack-without; the log had [])" in out
    assert f"resume: docs dir = {docs} (from --docs-dir" in out
    assert "resume: max retries = 3 (from --max-retries)" in out
    assert "resume: timeout = 30 s (from --timeout)" in out
    assert "resume: stream = False (from --no-stream; the log had True)" in out
    resumed = next(e for e in read_events(log)[0] if e.event == "session_resumed")
    assert resumed.config.pack_without == ["other"]

    # nothing given: the log's pages stay out, and the defaults are named as such
    end, log, _ = _session(tmp_path / "again", [Fail(401, "authentication_error")], said, _config())
    before = log.read_text()
    rc, out, err = _generate(capsys, "--resume", str(log), "--base-url", "http://127.0.0.1:9", "--pack-without", "nope")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--pack-without 'nope' matches no page" in err
    assert log.read_text() == before  # a refused resume leaves the log as it was
    with Loopback("anthropic", [Reply("nothing"), Reply("nothing")], model=PRICED) as server:
        rc, out, err = _generate(capsys, "--resume", str(log), "--base-url", server.url)
    assert rc == 1, err
    assert "resume: max retries = 9 (from the default; the log does not record it)" in out
    assert "resume: timeout = 600 s (from the default; the log does not record it)" in out
    assert "resume: stream = True (from the log)" in out and "resume: pack without = [] (from the log)" in out
    assert "docs dir" not in out and server.requests[0].get("stream") is True


def test_a_session_that_ended_otherwise_is_not_resumed(tmp_path, anthropic_key, said, capsys):
    end, log, _ = _session(tmp_path, [Reply("nothing"), Reply("nothing")], said, _config())
    assert end.outcome == "gave_up"
    rc, out, err = _generate(capsys, "--resume", str(log))
    assert rc == 2 and err.strip().splitlines() == [
        f"epiforge: {log}: the session already ended (gave_up); only a session that ended on a backend error can "
        "be resumed: replay or fork it instead"]
    assert "resume:" not in out  # refused before the resumed settings are listed


def test_kill_9_during_a_check_then_a_resume(tmp_path, sdk, capsys):
    logs = tmp_path / "runs"
    with Loopback(sdk.name, [Reply("writing", [("write_kernel", {"source": K1_GOOD}), ("run_check", {})])],
                  model=sdk.model) as server:
        env = os.environ | {"PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-m", "epiforge", "generate", "--task", "k1", "--backend", sdk.name,
                                 "--model", sdk.model, "--base-url", server.url, "--log-dir", str(logs), *FAST],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            text = "".join(p.read_text() for p in logs.glob("*.jsonl")) if logs.is_dir() else ""
            if '"event":"tool_called"' in text and '"name":"run_check"' in text:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()
        os.killpg(proc.pid, signal.SIGKILL)  # the session and its judge, mid-check
        proc.wait()
    (log,) = logs.glob("*.jsonl")
    killed = log.read_text()
    assert '"event":"evaluation"' not in killed and '"session_ended"' not in killed
    with Loopback(sdk.name, [Reply("submitting", [("submit", {})])], model=sdk.model) as server:
        rc, out, err = _generate(capsys, "--resume", str(log), "--base-url", server.url)
        assert len(server.requests) == 1
    assert rc == 0, err
    assert log.read_text().startswith(killed)  # nothing the killed run wrote is lost or rewritten
    events, _ = read_events(log)
    checks = [e for e in events if e.event == "evaluation"]
    assert [(e.step, e.purpose, e.outcome) for e in checks] == [(0, "check", "PASSED"), (1, "submit", "PASSED")]
    assert events[-1].outcome == "passed" and events[-1].totals.turns == 2


# ---- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("flags, line", [
    (["--budget-usd", "0"], "--budget-usd must be more than 0 (got 0)"),
    (["--budget-usd", "-1"], "--budget-usd must be more than 0 (got -1)"),
    (["--max-turns", "0"], "--max-turns must be at least 1 (got 0)"),
    (["--max-wall-s", "0"], "--max-wall-s must be more than 0 (got 0)"),
    (["--max-retries", "-1"], "--max-retries must be at least 0 (got -1)"),
    (["--price-in", "1"], "--price-in and --price-out go together: give both (USD per million tokens) or neither"),
])
def test_bad_numbers_are_one_line_and_leave_no_log(tmp_path, anthropic_key, capsys, flags, line):
    rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--base-url", "http://127.0.0.1:9",
                             "--log-dir", str(tmp_path), *flags)
    assert rc == 2 and err.strip().splitlines() == [f"epiforge: {line}"]
    assert list(tmp_path.iterdir()) == []


def test_a_log_with_a_zero_dollar_budget_resumes_once_given_a_budget(tmp_path, anthropic_key, said, capsys):
    """What the old CLI left behind (--budget-usd 0): resuming it says what to do, in one line."""
    config = _config().model_copy(update={"max_output_tokens": 2048})
    end, log, _ = _session(tmp_path, [Fail(401, "authentication_error")], said, config)
    lines = log.read_text().splitlines()
    start = json.loads(lines[0])
    start["config"]["budget"]["max_usd"] = 0
    log.write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")
    rc, out, err = _generate(capsys, "--resume", str(log), "--base-url", "http://127.0.0.1:9")
    assert rc == 2 and err.strip().splitlines() == ["epiforge: --budget-usd must be more than 0 dollars (got 0)"]
    with Loopback("anthropic", [Reply("nothing"), Reply("nothing")], model=PRICED) as server:
        rc, out, err = _generate(capsys, "--resume", str(log), "--base-url", server.url, "--budget-usd", "5")
    assert rc == 1 and "max usd = 5.0 (from --budget-usd; the log had 0.0)" in out
    assert read_events(log)[0][-1].outcome == "gave_up"
    assert {body["max_tokens"] for body in server.requests} == {2048}  # the log's, not the default


# ---- budgets -------------------------------------------------------------------------------


def test_an_unpriced_model_with_a_dollar_budget_is_refused_before_anything(tmp_path, anthropic_key, capsys):
    with Loopback("anthropic", [Reply("hi")], model="my-local-model") as server:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", "my-local-model",
                                 "--base-url", server.url, "--budget-usd", "1", "--log-dir", str(tmp_path), *FAST)
        assert server.requests == []
    assert rc == 2 and err.strip().splitlines() == [
        "epiforge: --budget-usd needs a price for model 'my-local-model', which agent/pricing.py does not list: "
        "give --price-in and --price-out (USD per million tokens)"]
    assert list(tmp_path.iterdir()) == []


def test_given_prices_price_every_turn_and_hold_the_budget(tmp_path, sdk, said):
    # each turn: 30,000 input tokens (the pack is ~29k) and 1,000 output at $2 / $10 per MTok = $0.07
    reply = Reply("looking", [("list_examples", {})], input_tokens=30000, output_tokens=1000, cache_read=0,
                  cache_write=0)
    config = _config("my-local-model", sdk.name, max_usd=0.25).model_copy(update={"price_in": 2.0, "price_out": 10.0})
    end, log, server = _session(tmp_path, [reply] * 8, said, config)
    responses = [e for e in read_events(log)[0] if e.event == "model_response"]
    assert all(r.cost_usd == pytest.approx(0.07) for r in responses)
    assert end.outcome == "budget_exhausted" and end.reason.startswith("dollar budget")
    assert end.totals.cost_usd <= 0.25 and len(server.requests) == len(responses) == 3  # a 4th would pass $0.25


def test_no_request_is_sent_that_the_budget_cannot_pay_for(tmp_path, sdk, said):
    end, log, server = _session(tmp_path, [Reply("hi")], said, _config(sdk.model, sdk.name, max_usd=0.0001))
    assert server.requests == [] and end.outcome == "budget_exhausted" and end.reason.startswith("dollar budget")
    assert not [e for e in read_events(log)[0] if isinstance(e, ModelRequest)]
    end, _, server = _session(tmp_path / "t", [Reply("hi")], said, _config(sdk.model, sdk.name, max_tokens=200))
    assert server.requests == [] and end.reason.startswith("token budget")


def test_the_last_turn_warning_covers_the_token_budget(tmp_path, sdk, said):
    reply = Reply("looking", [("list_examples", {})], input_tokens=30000, output_tokens=500, cache_read=0,
                  cache_write=0)
    end, _, server = _session(tmp_path, [reply] * 8, said, _config(sdk.model, sdk.name, max_tokens=100_000))
    warned = ["last turn the budget allows (token budget" in json.dumps(body["messages"][-1])
              for body in server.requests]
    assert end.outcome == "budget_exhausted" and end.reason.startswith("token budget")
    assert end.totals.usage.total <= 100_000 and len(server.requests) == 3
    assert warned[-1] and not warned[0]  # the model heard it before its last request, not from the start


def _warned(server, budget):
    return ["last turn the budget allows (" + budget in json.dumps(body["messages"][-1]) for body in server.requests]


def test_the_last_turn_warning_covers_the_turn_budget(tmp_path, sdk, said):
    end, _, server = _session(tmp_path, [Reply("looking", [("list_examples", {})])] * 8, said,
                              _config(sdk.model, sdk.name, max_turns=3))
    assert end.outcome == "budget_exhausted" and end.reason.startswith("turn budget")
    assert _warned(server, "turn budget") == [False, False, True]  # before the third and last request only


def test_the_last_turn_warning_covers_the_dollar_budget(tmp_path, sdk, said):
    reply = Reply("looking", [("list_examples", {})], input_tokens=30000, output_tokens=1000, cache_read=0,
                  cache_write=0)  # $0.07 a turn at $2 / $10 per MTok
    config = _config("my-local-model", sdk.name, max_usd=0.25).model_copy(update={"price_in": 2.0, "price_out": 10.0})
    end, _, server = _session(tmp_path, [reply] * 8, said, config)
    assert end.outcome == "budget_exhausted" and end.reason.startswith("dollar budget")
    assert _warned(server, "dollar budget") == [False, False, True]


def test_the_last_turn_warning_covers_the_wall_time_budget(tmp_path, sdk, said):
    def slow(body):  # a model that takes a second a turn
        time.sleep(1.0)
        return Reply("looking", [("list_examples", {})])

    end, _, server = _session(tmp_path, slow, said, _config(sdk.model, sdk.name, max_wall_s=3.5))
    assert end.outcome == "budget_exhausted" and end.reason.startswith("wall-time budget")
    warned = _warned(server, "wall-time budget")
    assert len(warned) >= 2 and warned[-1] and not warned[0]  # heard before its last request, not from the start


def test_a_check_timeout_follows_the_task():
    from epiforge import tasks

    k1, k5 = tasks.get_task("k1"), tasks.get_task("k5")
    assert check_timeout_s(k5, "cpu", "smoke", False) > check_timeout_s(k1, "cpu", "smoke", False)  # more GEMM work
    assert check_timeout_s(k1, "cpu", "smoke", True) > check_timeout_s(k1, "cpu", "smoke", False)  # the compile
    assert check_timeout_s(k1, "cuda", "paper", False) > check_timeout_s(k1, "cuda", "smoke", False)
    assert check_timeout_s(k5, "cpu", "smoke", True) < 600  # under the evaluator's blanket default


def test_the_wall_budget_cuts_a_hanging_check_short_with_progress(tmp_path, sdk, said):
    script = [Reply("writing", [("write_kernel", {"source": K1_HANGS}), ("run_check", {})]), Reply("more")]
    t0 = time.monotonic()
    end, log, server = _session(tmp_path, script, said, _config(sdk.model, sdk.name, max_wall_s=8))
    assert time.monotonic() - t0 < 40  # not the task's check timeout (> 60 s)
    (check,) = [e for e in read_events(log)[0] if e.event == "evaluation"]
    assert check.outcome == "TIMEOUT" and "wall-time budget ran out" in check.message
    assert end.outcome == "budget_exhausted" and end.reason.startswith("wall-time budget")
    assert len(server.requests) == 1
    assert any(line.startswith("step 0: check (CPU, smoke): numerics") for line in said)


def _row_scale_docs(tmp_path, n):
    """A docs folder whose one page holds n row-scale epilogues, k1's answer under new names
    (written r * acc: not the expert's own graph, acc * rstd, which agent/answers.py would
    withhold before any screening): none has a verdict cached (each test's screen cache
    starts empty), so the pack's screening spends an evaluation on each."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Index\n")
    (docs / "scaling.md").write_text("# Scaling\n" + "".join(
        f'```python\nimport primitives as P\n\n@P.epilogue(operands={{"r": P.PerRow()}})\n'
        f'def rows_{i}(acc, r):\n    return {{"D": r * acc}}\n```\n' for i in range(1, n + 1)))
    return docs


@pytest.fixture
def quick_screen_progress(monkeypatch):
    from epiforge.agent.loop import ScreenWatch

    monkeypatch.setattr(ScreenWatch, "FIRST_S", 0.1)  # a line as soon as screening takes a moment
    monkeypatch.setattr(ScreenWatch, "EVERY_S", 1.0)


def test_a_wall_time_budget_spent_screening_the_pack_ends_the_session(tmp_path, anthropic_key, capsys,
                                                                       quick_screen_progress):
    logs = tmp_path / "runs"
    with Loopback("anthropic", [Reply("hi")], model=PRICED) as server:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", PRICED, "--base-url",
                                 server.url, "--docs-dir", str(_row_scale_docs(tmp_path, 3)), "--max-wall-s", "1",
                                 "--log-dir", str(logs), "--json", *FAST)
        assert server.requests == []  # no request: the budget went to screening
    assert rc == 1 and "Traceback" not in err
    end = json.loads(out)  # stdout is the one JSON object; the progress went to stderr
    assert end["outcome"] == "budget_exhausted" and end["totals"]["turns"] == 0
    assert end["reason"].startswith("wall-time budget: ") and "s of it screening the knowledge pack for k1; 1 of its " in end["reason"]
    assert end["totals"]["wall_s"] >= 1  # the screening's time is the session's
    assert "screening the knowledge pack for k1: 0 of " in err and f"budget_exhausted ({end['reason']})" in err
    assert "screening the knowledge pack for k1: stopped at the wall-time budget, 1 of " in err
    # one verdict was computed before the budget ran out, and it is kept for the next session
    computed = [v for v in json.loads((tmp_path / "screen_cache.json").read_text()).values() if "passed" in v]
    assert [v["passed"] for v in computed] == [True]
    (log,) = logs.glob("*.jsonl")
    start = read_events(log)[0][0]
    assert start.screen_s >= 1 and start.pack.unscreened == end["reason"]
    # what was not screened was not offered (the page's blocks; before them, what agent/answers.py cut from examples)
    why = [w["why"] for w in start.pack.withheld_code if w["where"].startswith("page scaling")]
    assert why[0] == "epilogue rows_1 with r=rstd passes k1's check" and len(why) == 3  # the page's 3 blocks
    assert all(w == f"not screened: {end['reason']}" for w in why[1:])
    assert any(w["where"].startswith("example ") and w["why"] == f"not screened: {end['reason']}"
               for w in start.pack.withheld_code)  # and every example left


def test_screening_the_pack_shows_progress_on_stderr_and_counts_as_wall_time(tmp_path, anthropic_key, capsys,
                                                                            quick_screen_progress):
    from epiforge.agent.transcript import rebuild

    logs = tmp_path / "runs"
    with Loopback("anthropic", [Reply("hi"), Reply("hi")], model=PRICED) as server:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", PRICED, "--base-url",
                                 server.url, "--docs-dir", str(_row_scale_docs(tmp_path, 1)), "--max-wall-s", "300",
                                 "--log-dir", str(logs), *FAST)
        assert len(server.requests) == 2
        assert "rows_1" not in json.dumps(server.requests[0]["system"])  # screened and withheld: k1's answer
    assert rc == 1, err
    lines = err.splitlines()
    assert lines[0].startswith("screening the knowledge pack for k1: 0 of ") and "s left" in lines[0]
    assert lines[-1].startswith("screening the knowledge pack for k1: done, ") and lines[-1].endswith(" s")
    assert "knowledge pack" not in out  # stdout has the session's lines only
    (log,) = logs.glob("*.jsonl")
    events, _ = read_events(log)
    assert events[0].screen_s > 0.1 and events[0].pack.unscreened is None
    assert events[-1].outcome == "gave_up" and events[-1].totals.wall_s >= events[0].screen_s
    assert rebuild(events).totals.wall_s >= events[0].screen_s  # and a resume counts it from the log


def test_a_resume_counts_its_screening_against_the_wall_time_budget(tmp_path, anthropic_key, said, capsys,
                                                                    quick_screen_progress):
    from epiforge.agent.transcript import rebuild

    end, log, _ = _session(tmp_path, [Fail(401, "authentication_error")], said, _config())
    assert end.outcome == "backend_error"
    budget = rebuild(read_events(log)[0]).totals.wall_s + 1  # a second left: less than one verdict takes
    with Loopback("anthropic", [Reply("hi")], model=PRICED) as server:
        rc, out, err = _generate(capsys, "--resume", str(log), "--base-url", server.url, "--max-wall-s", f"{budget:.3f}",
                                 "--docs-dir", str(_row_scale_docs(tmp_path, 3)))
        assert server.requests == []
    assert rc == 1 and "Traceback" not in err
    events, _ = read_events(log)
    resumed, end = next(e for e in events if e.event == "session_resumed"), events[-1]
    assert end.outcome == "budget_exhausted" and "s of it screening the knowledge pack for k1; " in end.reason
    assert resumed.screen_s >= 1 and end.totals.wall_s >= budget
    assert "screening the knowledge pack for k1: 0 of " in err


# ---- output --------------------------------------------------------------------------------


def test_generate_json_prints_only_json_on_stdout(tmp_path, anthropic_key, capsys):
    script = [Reply("writing", [("write_kernel", {"source": K1_GOOD}), ("submit", {})])]
    with Loopback("anthropic", script, model=PRICED) as server:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", PRICED, "--base-url",
                                 server.url, "--log-dir", str(tmp_path), "--json", *FAST)
    assert rc == 0
    end = json.loads(out)
    assert end["event"] == "session_ended" and end["outcome"] == "passed"
    assert f"session {end['session']}: passed" in err and "step 0: write_kernel, submit" in err


def test_feedback_reaching_the_model_after_a_static_rejection(tmp_path, anthropic_key, said):
    script = [Reply("writing", [("write_kernel", {"source": "import os\n" + K1_GOOD}), ("run_check", {})]),
              Reply("done"), Reply("done")]
    end, log, _ = _session(tmp_path, script, said, _config())
    events, _ = read_events(log)
    write, check = [e for e in events if e.event == "tool_result"]
    assert write.is_error and "static checks reject it (STATIC_REJECTED; nothing ran)" in write.content
    assert "import os" in write.content and "Next: run_check" not in write.content
    assert "nothing ran" in check.content
    assert "emulator" not in check.content.lower() and "seed" not in check.content.lower()
    (evaluation,) = [e for e in events if e.event == "evaluation"]
    assert evaluation.seed is None and evaluation.outcome == "STATIC_REJECTED"


def test_a_long_stage_is_never_silence(said):
    from epiforge.agent.tools import Progress

    with Progress(said.say, "step 3: check (CPU, smoke)", 160, every_s=0.05) as progress:
        progress.stage("load")
        progress.stage("numerics")
        progress.stage("numerics")  # the judge says it again for the next shape
        time.sleep(0.3)
    assert said[:2] == ["step 3: check (CPU, smoke): load (0 s)", "step 3: check (CPU, smoke): numerics (0 s)"]
    beats = said[2:]
    assert beats and all(b.startswith("step 3: check (CPU, smoke): still in numerics, ") for b in beats)
    assert beats[-1].endswith("of at most 160 s")
    n = len(said)
    time.sleep(0.2)
    assert len(said) == n  # and quiet once the evaluation is over


@pytest.mark.parametrize("flag", ["--log-dir", "--workspace", "--out"])
def test_a_folder_that_cannot_be_written_is_one_line_before_anything(tmp_path, anthropic_key, capsys, flag):
    (tmp_path / "a-file").write_text("not a folder\n")
    bad = tmp_path / "a-file" / "x"
    logs = tmp_path / "runs"
    folders = {"--log-dir": str(logs), "--workspace": str(tmp_path / "ws"), "--out": str(tmp_path / "gen")} | {flag: str(bad)}
    with Loopback("anthropic", [Reply("hi")], model=PRICED) as server:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", PRICED, "--base-url",
                                 server.url, *[x for item in folders.items() for x in item], *FAST)
        assert server.requests == []
    assert rc == 2 and err.strip().splitlines() == [f"epiforge: {flag} {bad}: {tmp_path / 'a-file'} is not a directory"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # no log, no workspace, nothing begun
    if flag == "--workspace":
        return  # --runs gives each run its own workspace
    del folders["--workspace"]
    with Loopback("anthropic", [Reply("hi")], model=PRICED) as server:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", PRICED, "--base-url",
                                 server.url, "--runs", "2", *[x for item in folders.items() for x in item], *FAST)
        assert server.requests == []
    assert rc == 2 and err.strip().splitlines() == [f"epiforge: {flag} {bad}: {tmp_path / 'a-file'} is not a directory"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_workspace_of_the_users_files_is_refused_and_left_as_it_was(tmp_path, anthropic_key, capsys):
    """A session writes PROMPT.md, check and kernel.py in its workspace: a folder holding
    other files is refused before anything starts; an empty one is used and marked, and a
    session's marked workspace may be named again."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "PROMPT.md").write_text("my notes\n")
    (mine / "check").write_text("#!/bin/sh\necho mine\n")
    with Loopback("anthropic", [Reply("hi")], model=PRICED) as server:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", PRICED, "--base-url",
                                 server.url, "--workspace", str(mine), "--log-dir", str(tmp_path / "logs"), *FAST)
        assert server.requests == []
    assert rc == 2 and err.strip().splitlines() == [
        f"epiforge: --workspace {mine}: holds files no epiforge session wrote (PROMPT.md, check); a session writes "
        "PROMPT.md, check and kernel.py there: name a new or empty folder"]
    assert (mine / "PROMPT.md").read_text() == "my notes\n" and (mine / "check").read_text() == "#!/bin/sh\necho mine\n"
    assert not (tmp_path / "logs").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    for _ in range(2):  # the second time the folder is a session's workspace
        with Loopback("anthropic", [Reply("hi")], model=PRICED) as server:
            # one turn: the scripted reply is the only one (a second request would meet the
            # retries of an exhausted script, minutes of backoff)
            rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", PRICED, "--base-url",
                                     server.url, "--workspace", str(empty), "--log-dir", str(tmp_path / "logs"),
                                     "--max-turns", "1", *FAST)
            assert len(server.requests) == 1, err
        assert "holds files" not in err and (empty / ".epiforge-workspace").is_file()


def test_a_bad_folder_on_resume_leaves_the_log_as_it_was(tmp_path, anthropic_key, said, capsys):
    end, log, _ = _session(tmp_path, [Fail(401, "authentication_error")], said, _config())
    before = log.read_text()
    (tmp_path / "a-file").write_text("not a folder\n")
    for flag in ("--out", "--workspace"):
        rc, out, err = _generate(capsys, "--resume", str(log), "--base-url", "http://127.0.0.1:9", flag,
                                 str(tmp_path / "a-file"))
        assert rc == 2 and err.strip().splitlines() == [f"epiforge: {flag} {tmp_path / 'a-file'}: not a directory"]
        assert log.read_text() == before


def test_a_kernel_that_cannot_be_saved_still_ends_the_log(tmp_path, anthropic_key, capsys):
    """--out turns bad during the session (the last resort): the end is logged, the kernel's
    source with it, and the command says so in one line."""
    gen = tmp_path / "gen"

    def submit(body):
        gen.mkdir()
        (gen / "k1_gemm_rmsnorm").write_text("in the way\n")  # where the kernel's folder would go
        return Reply("submitting", [("write_kernel", {"source": K1_GOOD}), ("submit", {})])

    with Loopback("anthropic", [submit], model=PRICED) as server:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", PRICED, "--base-url",
                                 server.url, "--log-dir", str(tmp_path / "runs"), "--out", str(gen), *FAST)
    (log,) = (tmp_path / "runs").glob("*.jsonl")
    assert rc == 2 and "Traceback" not in err and err.strip().splitlines() == [
        f"epiforge: --out {gen}: the passing kernel could not be written (File exists); the session's log {log} is "
        "complete and holds its source"]
    events, _ = read_events(log)
    assert events[-1].outcome == "passed" and events[-1].generated_kernel is None
    assert K1_GOOD in [e.input.get("source") for e in events if e.event == "tool_called"]
