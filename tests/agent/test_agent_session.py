"""Session logs: events round-trip, the file is append-only and fsynced, bad lines are one
clear error except a truncated last line (a killed writer), which is a warning."""

import json

import pytest

from epiforge.agent.session import (
    ApiRetry, Budget, Evaluation, HarnessNote, LogError, ModelRequest, ModelResponse, PackInfo, SessionConfig,
    SessionEnded, SessionLog, SessionResumed, SessionStarted, TextBlock, ToolCalled, ToolResult, ToolUseBlock,
    Totals, Usage, read_events, truncated_last_line,
)

S = "20261130T000000Z-k1-abcdef"


def _events():
    config = SessionConfig(task="k1_gemm_rmsnorm", backend="anthropic", model="m", budget=Budget(max_turns=3))
    return [
        SessionStarted(session=S, config=config, pack=PackInfo(sha256="0" * 64, docs={"index": "abc"}),
                       system_sha256="1" * 64, prompt="write k1", environment={"python": "3.11"}),
        ModelRequest(session=S, step=0, n_messages=1, chars=10),
        ApiRetry(session=S, step=0, attempt=1, error="anthropic: HTTP 429", wait_s=0.5),
        ModelResponse(session=S, step=0, content=[TextBlock(text="hi"), ToolUseBlock(id="t1", name="submit", input={})],
                      stop_reason="tool_use", usage=Usage(input_tokens=5, output_tokens=7), cost_usd=0.01, latency_s=0.2),
        ToolCalled(session=S, step=0, call_id="t1", name="submit", input={}),
        Evaluation(session=S, step=0, call_id="t1", purpose="submit", kernel_sha256="2" * 64, device="cpu",
                   shapes="smoke", compile=False, seed=7, outcome="PASSED", message="ok"),
        ToolResult(session=S, step=0, call_id="t1", name="submit", content="accepted"),
        HarnessNote(session=S, step=0, text="one turn left"),
        SessionEnded(session=S, outcome="passed", reason="done", totals=Totals(turns=1)),
    ]


def test_events_round_trip(tmp_path):
    path = tmp_path / "s.jsonl"
    written = _events()
    log = SessionLog.create(path)
    for e in written:
        log.write(e)
    log.close()
    events, warnings = read_events(path)
    assert warnings == []
    assert [e.model_dump() for e in events] == [e.model_dump() for e in written]
    assert all(json.loads(line)["session"] == S for line in path.read_text().splitlines())


def test_a_log_is_never_overwritten(tmp_path):
    path = tmp_path / "s.jsonl"
    log = SessionLog.create(path)
    log.write(_events()[0])
    log.close()
    before = path.read_bytes()
    with pytest.raises(LogError, match="never overwritten"):
        SessionLog.create(path)
    assert path.read_bytes() == before


def test_write_validates_before_writing(tmp_path):
    path = tmp_path / "s.jsonl"
    log = SessionLog.create(path)
    bad = ModelRequest.model_construct(session=S, step=-1, n_messages=1, chars=1, t="x", event="model_request")
    bad.__dict__["n_messages"] = None  # what a buggy writer might hand over
    with pytest.raises(ValueError):
        log.write(bad)
    log.close()
    assert path.read_bytes() == b""


def test_truncated_last_line_is_a_warning(tmp_path):
    path = tmp_path / "s.jsonl"
    lines = [e.model_dump_json() for e in _events()[:4]]
    path.write_text("\n".join(lines) + "\n" + lines[4 - 1][:25])  # killed mid-line
    events, warnings = read_events(path)
    assert len(events) == 4
    assert len(warnings) == 1 and ":5: ignored a truncated line" in warnings[0]
    assert truncated_last_line(path) == 5


def test_a_bad_line_in_the_middle_is_one_clear_error(tmp_path):
    path = tmp_path / "s.jsonl"
    lines = [e.model_dump_json() for e in _events()[:4]]
    lines[2] = '{"event": "model_request", "session": "x"}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LogError) as info:
        read_events(path)
    msg = str(info.value)
    assert f"{path}:3: not a valid session event" in msg and "\n" not in msg


def test_the_first_event_must_start_the_session(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(_events()[1].model_dump_json() + "\n")
    with pytest.raises(LogError, match="session_started"):
        read_events(path)


def test_resuming_after_a_truncated_line_keeps_it_and_reads_cleanly(tmp_path):
    path = tmp_path / "s.jsonl"
    full = [e.model_dump_json() for e in _events()[:3]]
    original = ("\n".join(full) + "\n" + full[1][:30]).encode()
    path.write_bytes(original)
    skipped = truncated_last_line(path)
    log = SessionLog.append_to(path)
    log.write(SessionResumed(session=S, from_step=0, pack_sha256="0" * 64, skipped_line=skipped))
    log.write(_events()[3])
    log.close()
    assert path.read_bytes().startswith(original)  # nothing lost, nothing rewritten
    events, warnings = read_events(path)
    assert isinstance(events[-1], ModelResponse) and isinstance(events[-2], SessionResumed)
    assert len(warnings) == 1 and ":4:" in warnings[0]
