"""Replay (offline, kernels re-evaluated, divergences reported), fork (recorded steps, then a
live backend), resume (a killed session continues from its log), and the shipped example."""

import json
from pathlib import Path

import pytest
from loopback import Loopback, Reply
from scenarios import K1_GOOD, K1_OFF_BY_2PCT

from epiforge.agent.backends import make_backend
from epiforge.agent.demo import DEFAULT_EXAMPLE, EXAMPLES, run_demo
from epiforge.agent.loop import resume_session, run_session
from epiforge.agent.replay import replay
from epiforge.agent.session import Budget, LogError, ModelResponse, SessionConfig, read_events
from epiforge.agent.transcript import rebuild
from epiforge.eval.kernel import read_kernel

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

MODEL = "scripted-loopback-server"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A short anthropic session: a wrong kernel checked, then the right one submitted."""
    tmp = tmp_path_factory.mktemp("recorded")
    mp = pytest.MonkeyPatch()
    mp.setenv("ANTHROPIC_API_KEY", "test-key-loopback")
    script = [Reply("first try", [("write_kernel", {"source": K1_OFF_BY_2PCT}), ("run_check", {})]),
              Reply("fixed", [("write_kernel", {"source": K1_GOOD}), ("submit", {})])]
    with Loopback("anthropic", script) as server:
        backend = make_backend("anthropic", model=MODEL, base_url=server.url, timeout_s=10)
        config = SessionConfig(task="k1", backend="anthropic", model=MODEL, compile=False, device="cpu",
                               budget=Budget(max_turns=5))
        end, log = run_session(config, backend, log_dir=tmp, workspace=tmp / "ws", out_dir=tmp / "gen", say=lambda _: None)
    mp.undo()
    assert end.outcome == "passed"
    return log


def test_a_tampered_recording_is_reported_where_it_diverges(recorded, tmp_path, said):
    lines = recorded.read_text().splitlines()
    out = []
    for line in lines:
        e = json.loads(line)
        if e["event"] == "evaluation" and e["step"] == 0:
            e["outcome"] = "PASSED"  # as if this machine had once passed the wrong kernel
        out.append(json.dumps(e))
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("\n".join(out) + "\n")
    report = replay(tampered, log_dir=tmp_path / "replays", workspace=tmp_path / "ws", say=said.say)
    assert report.outcome == "passed" and not report.reproduced
    assert [d.line() for d in report.divergences] == ["step 0: check (cpu, smoke): recorded PASSED, now INCORRECT_NUMERICS"]
    assert recorded.read_text().splitlines() == lines  # the recording is only read


def test_a_tool_that_answers_otherwise_is_shown_with_both_answers(recorded, tmp_path, said):
    """A recorded write_kernel answer turned into an error: the replay still reproduces (no
    verdict changed), and the difference names the step and both answers' first lines."""
    from epiforge.agent.cli import print_replay

    out = []
    for line in recorded.read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "tool_result" and e["step"] == 1 and e["name"] == "write_kernel":
            e["is_error"], e["content"] = True, "refused: a forged answer\nsecond line"
        out.append(json.dumps(e))
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("\n".join(out) + "\n")
    report = replay(tampered, log_dir=tmp_path / "replays", workspace=tmp_path / "ws", say=said.say)
    assert report.reproduced and report.divergences == []
    (d,) = report.differences
    assert d.step == 1 and d.what == "write_kernel" and (d.recorded, d.replayed) == ("error", "ok")
    assert d.recorded_text == "refused: a forged answer" and d.replayed_text.startswith("wrote kernel.py")
    lines = []
    print_replay(report, say=lines.append)
    assert "not verdicts" in lines[1]
    assert lines[2].startswith("  differs: step 1: write_kernel: recorded error ('refused: a forged answer'), now ok ('wrote kernel.py")


def test_fork_continues_with_a_live_backend(recorded, tmp_path, openai_key, said):
    with Loopback("openai", [Reply("my own fix", [("write_kernel", {"source": K1_GOOD}), ("submit", {})])],
                  model="local-model") as server:
        live = make_backend("openai", model="local-model", base_url=server.url, timeout_s=10)
        report = replay(recorded, log_dir=tmp_path, fork_at=1, live=live, out_dir=tmp_path / "gen",
                        workspace=tmp_path / "ws", say=said.say)
        assert len(server.requests) == 1
        # the live model sees the recorded conversation: step 0's kernel and its feedback
        sent = server.requests[0]["messages"]
        assert any("INCORRECT_NUMERICS" in (m.get("content") or "") for m in sent if m["role"] == "tool")
    assert report.outcome == "passed" and report.divergences == []
    events, _ = read_events(report.new_log)
    assert events[0].forked_from == {"log": recorded.name, "session": report.session, "step": 1}
    assert [e.source for e in events if isinstance(e, ModelResponse)] == ["replay", "live"]
    assert events[0].config.backend == "openai" and events[0].config.model == "local-model"
    assert read_kernel(events[-1].generated_kernel).backend == "openai"


def test_fork_at_a_step_that_was_not_recorded_is_refused(recorded, tmp_path, openai_key):
    live = make_backend("openai", model="m", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(LogError, match="--fork-at must be between 0 and 2"):
        replay(recorded, log_dir=tmp_path, fork_at=7, live=live)


def test_a_killed_session_resumes_from_its_log(recorded, tmp_path, anthropic_key, said):
    lines = recorded.read_text().splitlines(keepends=True)
    # killed while logging step 1's second tool call (submit), after its write_kernel had run
    cut = next(i for i, line in enumerate(lines) if '"tool_result"' in line and '"step":1' in line)
    killed = tmp_path / "killed.jsonl"
    prefix = "".join(lines[: cut + 1]) + lines[cut + 1][:40]
    killed.write_text(prefix)
    state = rebuild(read_events(killed)[0])
    assert [c.name for c in state.pending] == ["submit"] and len(state.partial) == 1
    assert [m.role for m in state.messages] == ["user", "assistant", "user", "assistant"]
    assert state.sources[state.current] == K1_GOOD
    with Loopback("anthropic", []) as server:  # the pending calls finish the session: no request is needed
        backend = make_backend("anthropic", model=MODEL, base_url=server.url, timeout_s=10)
        end, log = resume_session(killed, backend, workspace=tmp_path / "ws", out_dir=tmp_path / "gen", say=said.say)
        assert server.requests == []
    assert log == killed and killed.read_text().startswith(prefix)
    assert end.outcome == "passed" and end.totals.turns == 2
    events, warnings = read_events(killed)
    assert len(warnings) == 1 and "truncated" in warnings[0]
    resumed = next(e for e in events if e.event == "session_resumed")
    assert resumed.from_step == 2 and resumed.skipped_line == cut + 2
    with pytest.raises(LogError, match="already ended"):
        resume_session(killed, backend)


def test_a_resumed_session_asks_the_model_with_the_whole_conversation(recorded, tmp_path, anthropic_key, said):
    lines = recorded.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if '"model_request"' in line and '"step":1' in line)
    killed = tmp_path / "killed.jsonl"
    killed.write_text("".join(lines[:cut]))  # killed while waiting for step 1's answer
    script = [Reply("again", [("write_kernel", {"source": K1_GOOD}), ("submit", {})])]
    with Loopback("anthropic", script) as server:
        backend = make_backend("anthropic", model=MODEL, base_url=server.url, timeout_s=10)
        end, _ = resume_session(killed, backend, workspace=tmp_path / "ws", out_dir=tmp_path / "gen", say=said.say)
        messages = server.requests[0]["messages"]
    assert end.outcome == "passed"
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert "INCORRECT_NUMERICS" in json.dumps(messages[2])


def test_the_shipped_example_replays_end_to_end_on_this_machine(capsys, tmp_path):
    """The demo: the example session in logs/examples/ replayed offline, its kernels
    re-evaluated here with the sm_90a cross-compile, as recorded."""
    example = EXAMPLES / DEFAULT_EXAMPLE
    start = read_events(example)[0][0]
    assert start.config.backend == "anthropic" and start.config.model == "scripted-loopback-server"
    assert start.config.compile is True
    assert run_demo(type("Args", (), {"log": None, "experts": False})()) == 0
    out = capsys.readouterr().out
    assert "recorded passed, replayed passed in 6 steps: reproduced" in out
    assert "COMPILE_ERROR" in out and "INCORRECT_NUMERICS" in out
    assert len(list((tmp_path / "data" / "replays").glob("*.jsonl"))) == 1  # the replay's own, in the data dir


def test_every_shipped_log_is_valid():
    logs = sorted(Path(EXAMPLES).glob("*.jsonl"))
    assert logs
    for log in logs:
        events, warnings = read_events(log)
        assert warnings == [] and events[-1].event == "session_ended"
        assert "/work/" not in log.read_text() and "/home/" not in log.read_text()


def test_a_replay_does_not_spend_the_recorded_dollars_again(tmp_path, anthropic_key, said):
    config = SessionConfig(task="k1", backend="anthropic", model=MODEL, compile=False, device="cpu",
                           budget=Budget(max_turns=4), price_in=3.0, price_out=15.0)
    with Loopback("anthropic", [Reply("nothing"), Reply("nothing")]) as server:
        backend = make_backend("anthropic", model=MODEL, base_url=server.url, timeout_s=10)
        end, log = run_session(config, backend, log_dir=tmp_path, workspace=tmp_path / "ws", say=said.say)
    assert end.totals.cost_usd > 0
    said.clear()
    report = replay(log, log_dir=tmp_path / "replays", workspace=tmp_path / "ws2", say=said.say)
    assert report.reproduced
    (line,) = [s for s in said if s.startswith(f"session {report.new_session}: gave_up")]
    assert "nothing spent now" in line and f"the recording's ${end.totals.cost_usd:.4f}" in line


def test_a_log_with_a_budget_the_cli_now_refuses_still_replays(recorded, tmp_path, said):
    """Older logs may hold what a live run now refuses (a $0 budget, an unpriced model with a
    dollar budget): a replay spends nothing, so it runs them as recorded."""
    lines = recorded.read_text().splitlines()
    start = json.loads(lines[0])
    start["config"]["budget"]["max_usd"] = 0
    old = tmp_path / "old.jsonl"
    old.write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")
    report = replay(old, log_dir=tmp_path / "replays", workspace=tmp_path / "ws", say=said.say)
    assert report.reproduced and report.outcome == "passed"
