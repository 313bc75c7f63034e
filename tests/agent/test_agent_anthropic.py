"""Whole sessions through the real anthropic SDK client against a loopback server speaking
the Messages wire format: streamed tool-use turns, a 429 then success, a 500, a timeout, an
overloaded error mid-stream, an auth failure, and a missing key."""

import pytest
from loopback import Fail, Loopback, Reply, Stall, StreamError, last_tool_results
from scenarios import K1_GOOD, K1_OFF_BY_2PCT

from epiforge.agent.backends import BackendError, make_backend
from epiforge.agent.loop import run_session
from epiforge.agent.session import ApiRetry, Budget, Evaluation, ModelResponse, SessionConfig, read_events
from epiforge.eval.kernel import read_kernel

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

MODEL = "claude-sonnet-4-5-loopback"  # priced like claude-sonnet-4-5, so cost accounting is exercised


def _config(**kw):
    return SessionConfig(task="k1", backend="anthropic", model=MODEL, compile=False, device="cpu",
                         budget=Budget(max_turns=kw.pop("max_turns", 8)), **kw)


def _session(tmp_path, script, fast_retry, said, *, timeout_s=10.0, stream=True, **kw):
    with Loopback("anthropic", script, model=MODEL) as server:
        backend = make_backend("anthropic", model=MODEL, base_url=server.url, retry=fast_retry, timeout_s=timeout_s,
                               stream=stream)
        end, log = run_session(_config(**kw), backend, log_dir=tmp_path / "logs", workspace=tmp_path / "ws",
                               out_dir=tmp_path / "generated", say=said.say)
    return end, log, server


def test_a_streamed_session_writes_checks_and_submits_a_passing_kernel(tmp_path, anthropic_key, fast_retry, said):
    def fix_after_feedback(body):
        feedback = last_tool_results(body)
        assert "INCORRECT_NUMERICS" in feedback and "max error" in feedback  # the worst mismatch reached the model
        return Reply("the scale is off; fixing", [("write_kernel", {"source": K1_GOOD}), ("run_check", {})])

    script = [
        Fail(429, "rate_limit_error", retry_after="0"),
        Reply("looking around", [("list_examples", {}), ("read_example", {"task": "k1"}), ("read_example", {"task": "k2"})]),
        Reply("first try", [("write_kernel", {"source": K1_OFF_BY_2PCT}), ("run_check", {})]),
        fix_after_feedback,
        Reply(None, [("submit", {})]),
    ]
    end, log, server = _session(tmp_path, script, fast_retry, said)
    assert end.outcome == "passed", said
    assert end.totals.turns == 4 and end.totals.evaluations == 2  # submit reused the passing check

    events, warnings = read_events(log)
    assert warnings == []
    retries = [e for e in events if isinstance(e, ApiRetry)]
    assert len(retries) == 1 and "HTTP 429 rate_limit_error" in retries[0].error
    responses = [e for e in events if isinstance(e, ModelResponse)]
    assert all(r.usage.input_tokens > 0 and r.usage.output_tokens > 0 and r.latency_s >= 0 for r in responses)
    assert responses[1].usage.cache_read_tokens > 0  # the pack came from the cache after the first turn
    assert end.totals.cost_usd == pytest.approx(sum(r.cost_usd for r in responses)) and end.totals.cost_usd > 0
    outcomes = [e.outcome for e in events if isinstance(e, Evaluation)]
    assert outcomes == ["INCORRECT_NUMERICS", "PASSED", "PASSED"]

    results = {e.call_id: e for e in events if e.event == "tool_result"}
    own = [r for r in results.values() if r.name == "read_example" and r.is_error]
    assert len(own) == 1 and "the task you are solving" in own[0].content

    # the wire: streamed, the key from the environment, the pack and the newest turn cached
    body = server.requests[-1]
    headers = server.headers[-1]
    assert body["stream"] is True and anthropic_key in (headers.get("x-api-key"), headers.get("authorization", "")[7:])
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert {t["name"] for t in body["tools"]} == {"read_doc", "list_examples", "read_example", "write_kernel",
                                                   "run_check", "run_benchmark", "submit"}

    kernel = read_kernel(end.generated_kernel)  # outside the repo it is recorded as a full path
    assert (kernel.session, kernel.backend, kernel.model) == (end.session, "anthropic", MODEL)


def test_transient_failures_are_retried_and_logged(tmp_path, anthropic_key, fast_retry, said):
    script = [
        Fail(500, "api_error"),
        Stall(1.5),  # longer than the client's 0.5 s timeout
        StreamError("overloaded_error"),
        Reply("nothing to do"),
        Fail(529, "overloaded_error"),
        Reply("still nothing"),
    ]
    end, log, _ = _session(tmp_path, script, fast_retry, said, timeout_s=0.5)
    assert end.outcome == "gave_up"  # two turns without a tool call
    retries = [e.error for e in read_events(log)[0] if isinstance(e, ApiRetry)]
    assert len(retries) == 4
    assert "HTTP 500" in retries[0] and "timed out" in retries[1]
    assert "overloaded_error" in retries[2] and "HTTP 529 overloaded_error" in retries[3]


def test_persistent_failure_ends_the_session_with_one_line(tmp_path, anthropic_key, fast_retry, said):
    end, log, server = _session(tmp_path, [Fail(503, "api_error")] * 4, fast_retry, said, stream=False)
    assert end.outcome == "backend_error"
    assert end.reason == "anthropic: HTTP 503 api_error: scripted failure (after 4 attempts)"
    assert len(server.requests) == 4 and "stream" not in server.requests[0]
    assert read_events(log)[0][-1].event == "session_ended"


def test_an_auth_failure_is_not_retried(tmp_path, anthropic_key, fast_retry, said):
    end, _, server = _session(tmp_path, [Fail(401, "authentication_error", "invalid x-api-key")], fast_retry, said)
    assert end.outcome == "backend_error" and len(server.requests) == 1
    assert end.reason == "anthropic: HTTP 401 authentication_error: invalid x-api-key"


def test_a_missing_key_is_one_clear_line(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(BackendError) as info:
        make_backend("anthropic")
    assert str(info.value).startswith("anthropic: ANTHROPIC_API_KEY is not set") and "\n" not in str(info.value)
