"""The command backend, driven by a scripted fake agent (fake_agent.py) in a prepared
workspace; and the replay of what it recorded, which needs no agent at all."""

import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from epiforge.agent.backends import BackendError, make_backend
from epiforge.agent.loop import run_session
from epiforge.agent.replay import replay
from epiforge.agent.session import Budget, Evaluation, ModelResponse, SessionConfig, read_events
from epiforge.eval.kernel import read_kernel

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

FAKE = Path(__file__).resolve().parent / "fake_agent.py"


@pytest.fixture(scope="module")
def command_session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("command")
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))}"
    # in the sandbox (the default, where the machine can set it up), which hides tests/: the fake
    # agent's folder exposed, as a user exposes an agent's install
    from epiforge.agent.sandbox import available

    sandbox = available()[0]
    backend = make_backend("command", command=command, model="scripted-fake-agent", sandbox=sandbox,
                           sandbox_expose=[str(FAKE.parent)])
    config = SessionConfig(task="k1", backend="command", model="scripted-fake-agent", command=command, compile=False,
                           device="cpu", budget=Budget(max_turns=4), sandbox=sandbox, sandbox_expose=[str(FAKE.parent)])
    said = []
    end, log = run_session(config, backend, log_dir=tmp / "logs", workspace=tmp / "ws", out_dir=tmp / "gen",
                           say=said.append)
    return end, log, tmp / "ws", said


def test_the_agent_works_in_a_prepared_workspace(command_session):
    end, log, ws, said = command_session
    assert end.outcome == "passed" and end.totals.turns == 2, said
    assert os.access(ws / "check", os.X_OK)
    assert (ws / "examples" / "k2_gemm_rmsnorm_swiglu.py").exists()
    assert not (ws / "examples" / "k1_gemm_rmsnorm.py").exists()  # never its own expert kernel
    assert "k1_gemm_rmsnorm" in (ws / "PROMPT.md").read_text() and "./check" in (ws / "PROMPT.md").read_text()
    # round 1 acted on round 0's verdict in FEEDBACK.md; after the pass FEEDBACK.md says the session is over
    responses = [e for e in read_events(log)[0] if isinstance(e, ModelResponse)]
    assert "fake agent: the scale was off; fixed" in responses[1].notes["stdout_tail"]
    over = (ws / "FEEDBACK.md").read_text()
    assert over.startswith("# The session is over: passed\n") and "No round follows" in over
    assert "the submitted kernel passed: provisionally: correct on the CPU emulator" in over  # no GPU: not timed


def test_what_it_leaves_is_evaluated_and_logged_as_tool_calls(command_session):
    end, log, _, _ = command_session
    events, _ = read_events(log)
    responses = [e for e in events if isinstance(e, ModelResponse)]
    assert [[b.name for b in r.content if b.type == "tool_use"] for r in responses] == [["write_kernel", "submit"]] * 2
    first = responses[0].notes
    assert first["exit_code"] == 0 and len(first["checks"]) == 1  # the agent ran ./check once itself
    assert first["checks"][0]["outcome"] == "INCORRECT_NUMERICS" and "fake agent: wrote" in first["stdout_tail"]
    assert [e.outcome for e in events if isinstance(e, Evaluation)] == ["INCORRECT_NUMERICS", "PASSED"]
    kernel = read_kernel(end.generated_kernel)
    assert (kernel.backend, kernel.model) == ("command", "scripted-fake-agent")


def test_the_log_records_that_the_agent_ran_in_the_sandbox(command_session):
    from epiforge.agent.sandbox import available

    ok, why = available()
    if not ok:
        pytest.skip(f"the agent's sandbox cannot be set up here: {why}")
    _, log, _, _ = command_session
    start = read_events(log)[0][0]
    assert start.config.sandbox is True and start.backend_info["sandbox"] is True
    assert start.backend_info["sandbox_expose"] == [str(FAKE.parent)]


def test_the_recorded_command_session_replays_without_the_agent(command_session, tmp_path, said):
    _, log, _, _ = command_session
    report = replay(log, log_dir=tmp_path / "replays", workspace=tmp_path / "ws", say=said.say)
    assert report.reproduced and report.outcome == "passed" and report.steps == 2
    new_events, _ = read_events(report.new_log)
    assert new_events[0].replay_of["session"] == report.session
    assert {e.source for e in new_events if isinstance(e, ModelResponse)} == {"replay"}


def test_a_missing_command_is_one_clear_line():
    with pytest.raises(BackendError, match="--command is required"):
        make_backend("command", command=None)
    with pytest.raises(BackendError, match="'no-such-agent-cli' is not an executable on PATH"):
        make_backend("command", command="no-such-agent-cli --flag")


def test_a_hanging_kernel_in_check_ends_before_the_deadline_and_is_never_silence(tmp_path, said, monkeypatch):
    """./check's timeout is the task's, cut to the session's wall time (EPIFORGE_DEADLINE), not
    the evaluator's 600 s; it prints its stages and heartbeats to the agent, and the harness
    says the agent is still running."""
    from epiforge.agent.backends.command_backend import CommandBackend
    from epiforge.agent.tools import check_timeout_s
    from epiforge import tasks

    monkeypatch.setattr(CommandBackend, "EVERY_S", 5.0)
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} --hang"
    backend = make_backend("command", command=command, model="scripted-fake-agent", note=said.say, sandbox=False)
    config = SessionConfig(task="k1", backend="command", model="scripted-fake-agent", command=command, compile=False,
                           device="cpu", budget=Budget(max_turns=2, max_wall_s=25))
    t0 = time.monotonic()
    end, log = run_session(config, backend, log_dir=tmp_path / "logs", workspace=tmp_path / "ws", out_dir=tmp_path / "gen",
                           say=said.say)
    assert time.monotonic() - t0 < 60  # the check's own limit is over a minute, the evaluator's default 600 s
    assert check_timeout_s(tasks.get_task("k1"), "cpu", "smoke", False) > 25
    notes = next(e for e in read_events(log)[0] if isinstance(e, ModelResponse)).notes
    (check,) = notes["checks"]  # the check ended, with its verdict, before the harness killed the agent
    assert check["outcome"] == "TIMEOUT" and check["timeout_s"] <= 20 and not notes["timed_out"]
    assert "check (CPU, smoke): numerics (" in notes["stdout_tail"]
    assert "check (CPU, smoke): still in numerics, " in notes["stdout_tail"]
    assert "wall-time budget ran out" in notes["stdout_tail"]
    assert any(line.startswith("step 0: the agent command is running, ") for line in said)
    assert end.outcome == "budget_exhausted" and end.reason.startswith("wall-time budget")


def test_check_judges_every_precision_and_dtype_narrows_it(tmp_path):
    """A workspace's ./check (agent/check.py) judges every precision the task lists by
    default; --dtype narrows one check, whose line names what it left out, and a precision
    the task does not list is one line and exit 2 (issue 43, point 3)."""
    import json
    import shutil
    import subprocess

    from epiforge.eval.machine import expert_kernel

    kernel = tmp_path / "kernel.py"
    shutil.copy(expert_kernel("k1_gemm_rmsnorm"), kernel)
    record = tmp_path / "checks.jsonl"
    base = [sys.executable, "-m", "epiforge.agent.check", "--task", "k1", "--kernel", str(kernel), "--no-compile",
            "--record", str(record)]
    both = subprocess.run(base, capture_output=True, text=True, timeout=300)
    narrowed = subprocess.run([*base, "--dtype", "fp16"], capture_output=True, text=True, timeout=300)
    bad = subprocess.run([*base, "--dtype", "fp32"], capture_output=True, text=True, timeout=60)
    assert both.returncode == 0 and narrowed.returncode == 0, both.stdout[-500:] + narrowed.stdout[-500:]
    assert [json.loads(x)["dtypes"] for x in record.read_text().splitlines()] == [["bfloat16", "float16"], ["float16"]]
    assert "not judged in bfloat16" in narrowed.stdout and "not judged" not in both.stdout
    assert bad.returncode == 2 and bad.stdout.strip().splitlines() == [
        "check: --dtype 'fp32': k1_gemm_rmsnorm runs in bfloat16, float16 (or all)"] and "Traceback" not in bad.stderr
