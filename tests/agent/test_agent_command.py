"""The command backend, driven by a scripted fake agent (fake_agent.py) in a prepared
workspace; and the replay of what it recorded, which needs no agent at all."""

import os
import shlex
import sys
from pathlib import Path

import pytest

from epiforge.agent.backends import BackendError, make_backend
from epiforge.agent.loop import run_session
from epiforge.agent.replay import replay
from epiforge.agent.session import Budget, Evaluation, ModelResponse, SessionConfig, read_events
from epiforge.eval.kernel import read_kernel

FAKE = Path(__file__).resolve().parent / "fake_agent.py"


@pytest.fixture(scope="module")
def command_session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("command")
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))}"
    backend = make_backend("command", command=command, model="scripted-fake-agent")
    config = SessionConfig(task="k1", backend="command", model="scripted-fake-agent", command=command, compile=False,
                           device="cpu", budget=Budget(max_turns=4))
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
    assert "INCORRECT_NUMERICS" in (ws / "FEEDBACK.md").read_text()  # the verdict on round 0, for round 1


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
