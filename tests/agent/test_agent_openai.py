"""Whole sessions through the real openai SDK client against a loopback server speaking the
chat-completions wire format (vLLM, Ollama and llama.cpp serve the same), with tools."""

import json

import pytest
from loopback import Fail, Loopback, Reply, last_tool_results
from scenarios import K1_GOOD

from epiforge import cli as epiforge
from epiforge.agent.backends import BackendError, make_backend
from epiforge.agent.loop import run_session
from epiforge.agent.session import ApiRetry, Budget, SessionConfig, read_events

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)


def _run(tmp_path, script, fast_retry, said, *, stream, model="qwen2.5-coder-loopback", **cfg):
    with Loopback("openai", script, model=model) as server:
        backend = make_backend("openai", model=model, base_url=server.url, retry=fast_retry, timeout_s=10, stream=stream)
        config = SessionConfig(task="k1", backend="openai", model=model, compile=False, device="cpu",
                               budget=Budget(max_turns=6), **cfg)
        end, log = run_session(config, backend, log_dir=tmp_path / "logs", workspace=tmp_path / "ws",
                               out_dir=tmp_path / "generated", say=said.say)
    return end, log, server


def test_a_session_with_tool_calls_passes(tmp_path, openai_key, fast_retry, said):
    def submit_after_pass(body):
        assert "check: PASSED" in last_tool_results(body)
        return Reply("submitting", [("submit", {})])

    script = [Reply("writing", [("write_kernel", {"source": K1_GOOD}), ("run_check", {})]), submit_after_pass]
    end, log, server = _run(tmp_path, script, fast_retry, said, stream=False)
    assert end.outcome == "passed", said
    body = server.requests[-1]
    assert body["messages"][0]["role"] == "system" and "fused GEMM-epilogue" in body["messages"][0]["content"]
    calls = body["messages"][2]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["write_kernel", "run_check"]
    assert json.loads(calls[0]["function"]["arguments"])["source"] == K1_GOOD
    assert [m["role"] for m in body["messages"][3:5]] == ["tool", "tool"]
    assert body["tools"][0]["type"] == "function" and "parameters" in body["tools"][0]["function"]
    assert end.totals.cost_usd is None  # a local model has no price: never a guess


def test_streamed_tool_calls_retries_and_broken_arguments(tmp_path, openai_key, fast_retry, said):
    script = [
        Fail(429, "rate_limit_exceeded", retry_after="0"),
        Reply("listing", [("list_examples", {}), ("read_example", {"task": "k2"})]),
        Fail(502, "bad_gateway"),
        Reply(None, [("read_doc", '{"name": "index"')]),  # cut-off JSON
        Reply("done thinking"),
        Reply("still thinking"),
    ]
    end, log, server = _run(tmp_path, script, fast_retry, said, stream=True)
    assert end.outcome == "gave_up"
    events, _ = read_events(log)
    assert [e.error.split(":")[1].strip() for e in events if isinstance(e, ApiRetry)] == ["HTTP 429", "HTTP 502"]
    results = [e for e in events if e.event == "tool_result"]
    assert [r.name for r in results] == ["list_examples", "read_example", "read_doc"]
    assert "k2_gemm_rmsnorm_swiglu" in results[1].content and not results[1].is_error
    assert results[2].is_error and results[2].content.startswith("the arguments were not valid JSON")
    assert server.requests[1]["stream"] is True and server.requests[1]["stream_options"] == {"include_usage": True}
    responses = [e for e in events if e.event == "model_response"]
    assert responses[0].usage.output_tokens > 0  # usage arrived in the final stream chunk


def test_unreachable_server_fails_at_once_with_one_line(tmp_path, openai_key, capsys):
    rc = epiforge.main(["generate", "--task", "k1", "--backend", "openai", "--model", "m", "--no-compile",
                        "--base-url", "http://127.0.0.1:9/v1", "--log-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("epiforge: openai: cannot reach http://127.0.0.1:9/v1/chat/completions")
    (log,) = tmp_path.glob("*.jsonl")
    assert read_events(log)[0][-1].outcome == "backend_error"  # the attempt is on record


def test_the_openai_endpoint_without_a_key_is_refused(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(BackendError, match="OPENAI_API_KEY is not set"):
        make_backend("openai", model="gpt-4o")
    with pytest.raises(BackendError, match="--model is required"):
        make_backend("openai", base_url="http://127.0.0.1:1/v1")
