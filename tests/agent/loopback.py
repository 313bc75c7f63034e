"""Loopback HTTP servers on 127.0.0.1 that speak the real wire formats the SDKs use: the
Anthropic Messages API (JSON and server-sent events) and OpenAI chat completions (JSON and
SSE chunks), with tool calls. A test scripts the "model" as a list of actions, each a
Reply, a Fail (HTTP error), a Stall (longer than the client's timeout) or a StreamError
(an error event in the middle of a stream); an action may also be a function of the
request body that returns one, so the script can react to the feedback it receives.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


@dataclass
class Reply:
    text: str | None = None
    tools: list[tuple[str, dict | str]] = field(default_factory=list)  # (name, input; openai: a str goes raw)
    # token counts the server reports; None: estimated from the request (~4 characters a
    # token, the system prompt counted as a cache write on the first request, a read after)
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read: int | None = None
    cache_write: int | None = None
    stop_reason: str | None = None  # default: tool_use when there are tools, else end_turn


@dataclass
class Fail:
    status: int
    error_type: str = "api_error"
    message: str = "scripted failure"
    retry_after: str | None = None


@dataclass
class Stall:
    seconds: float


@dataclass
class StreamError:
    error_type: str = "overloaded_error"


Action = Reply | Fail | Stall | StreamError | Callable[[dict], "Action"]


class Loopback:
    """Start with `with Loopback("anthropic", script) as server:`; `server.url` is the base URL
    to give the SDK; `server.requests` holds every request body received."""

    def __init__(self, protocol: str, script: list[Action] | Callable[[dict], Action],
                 model: str = "scripted-loopback-server"):
        """`script`: actions answered in order, or one function answering every request."""
        assert protocol in ("anthropic", "openai")
        self.protocol, self.model = protocol, model
        self.script = script if callable(script) else list(script)
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self._lock = threading.Lock()
        self._ids = 0
        self._replies = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with outer._lock:
                    outer.requests.append(body)
                    outer.headers.append({k.lower(): v for k, v in self.headers.items()})
                    if callable(outer.script):
                        action = outer.script
                    else:
                        action = outer.script.pop(0) if outer.script else Fail(500, message="script exhausted")
                while callable(action):
                    action = action(body)
                if isinstance(action, Reply):
                    action = outer._with_usage(action, body)
                try:
                    outer._answer(self, body, action)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (a timeout test)

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = base if protocol == "anthropic" else base + "/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        if self.server.errors and exc[0] is None:  # the script's own failure fails the test, here
            raise AssertionError("the loopback server failed:\n" + self.server.errors[0])

    def _with_usage(self, action: Reply, body: dict) -> Reply:
        system = len(json.dumps(body.get("system", ""))) // 4
        rest = len(json.dumps(body.get("messages", []))) // 4
        first = self._replies == 0
        self._replies += 1
        out = len(json.dumps([action.text, action.tools])) // 4
        defaults = {"input_tokens": rest if self.protocol == "anthropic" else rest + system,
                    "output_tokens": out,
                    "cache_write": system if (self.protocol == "anthropic" and first) else 0,
                    "cache_read": system if (self.protocol == "anthropic" and not first) else 0}
        return Reply(**{**defaults, **{k: v for k, v in action.__dict__.items() if v is not None}})

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}_{self._ids:04d}"

    # ---- answers ----------------------------------------------------------------------------

    def _answer(self, h, body: dict, action) -> None:
        if isinstance(action, Stall):
            time.sleep(action.seconds)
            action = Reply(text="too late")
        if isinstance(action, Fail):
            if self.protocol == "anthropic":
                payload = {"type": "error", "error": {"type": action.error_type, "message": action.message}}
            else:
                payload = {"error": {"message": action.message, "type": action.error_type, "code": None}}
            headers = {"retry-after": action.retry_after} if action.retry_after is not None else {}
            return _send(h, action.status, "application/json", json.dumps(payload).encode(), headers)
        stream = bool(body.get("stream"))
        if self.protocol == "anthropic":
            return self._anthropic(h, action, stream)
        return self._openai(h, action, stream)

    def _anthropic(self, h, action, stream: bool) -> None:
        if isinstance(action, StreamError):
            events = [("message_start", {"type": "message_start", "message": self._anthropic_message(Reply(), [])}),
                      ("error", {"type": "error", "error": {"type": action.error_type, "message": "Overloaded"}})]
            return _send_sse(h, events)
        blocks = ([{"type": "text", "text": action.text}] if action.text else []) + [
            {"type": "tool_use", "id": self._next_id("toolu"), "name": name, "input": args} for name, args in action.tools]
        message = self._anthropic_message(action, blocks)
        if not stream:
            return _send(h, 200, "application/json", json.dumps(message).encode())
        start = dict(message, content=[], stop_reason=None, usage=dict(message["usage"], output_tokens=1))
        events = [("message_start", {"type": "message_start", "message": start}), ("ping", {"type": "ping"})]
        for i, b in enumerate(blocks):
            if b["type"] == "text":
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {"type": "text", "text": ""}}))
                for piece in _pieces(b["text"]):
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                           "delta": {"type": "text_delta", "text": piece}}))
            else:
                events.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block":
                                                       {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}}))
                for piece in _pieces(json.dumps(b["input"])):
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                           "delta": {"type": "input_json_delta", "partial_json": piece}}))
            events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"],
                                         "stop_sequence": None}, "usage": {"output_tokens": action.output_tokens}}))
        events.append(("message_stop", {"type": "message_stop"}))
        _send_sse(h, events)

    def _anthropic_message(self, action: Reply, blocks: list) -> dict:
        return {"id": self._next_id("msg"), "type": "message", "role": "assistant", "model": self.model,
                "content": blocks, "stop_reason": action.stop_reason or ("tool_use" if action.tools else "end_turn"),
                "stop_sequence": None,
                "usage": {"input_tokens": action.input_tokens, "output_tokens": action.output_tokens,
                          "cache_creation_input_tokens": action.cache_write, "cache_read_input_tokens": action.cache_read}}

    def _openai(self, h, action, stream: bool) -> None:
        calls = [{"id": self._next_id("call"), "type": "function",
                  "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                 for name, args in action.tools]  # a str is sent as is: broken JSON, as small models write
        finish = action.stop_reason or ("tool_calls" if calls else "stop")
        usage = {"prompt_tokens": action.input_tokens + action.cache_read, "completion_tokens": action.output_tokens,
                 "total_tokens": action.input_tokens + action.cache_read + action.output_tokens,
                 "prompt_tokens_details": {"cached_tokens": action.cache_read}}
        base = {"id": self._next_id("chatcmpl"), "created": int(time.time()), "model": self.model}
        if not stream:
            message = {"role": "assistant", "content": action.text}
            if calls:
                message["tool_calls"] = calls
            payload = base | {"object": "chat.completion", "usage": usage,
                              "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
            return _send(h, 200, "application/json", json.dumps(payload).encode())
        chunk = base | {"object": "chat.completion.chunk"}
        events = [chunk | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
        for piece in _pieces(action.text or ""):
            events.append(chunk | {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
        for i, c in enumerate(calls):
            events.append(chunk | {"choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
                {"index": i, "id": c["id"], "type": "function", "function": {"name": c["function"]["name"], "arguments": ""}}]}}]})
            for piece in _pieces(c["function"]["arguments"]):
                events.append(chunk | {"choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
                    {"index": i, "function": {"arguments": piece}}]}}]})
        events.append(chunk | {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        events.append(chunk | {"choices": [], "usage": usage})
        _send_sse(h, [(None, e) for e in events] + [(None, "[DONE]")])


class _Server(ThreadingHTTPServer):
    """Keeps its handlers' failures (Loopback's __exit__ raises the first) instead of printing
    them into the stderr the test reads as the CLI's. A client that hung up (a reset between
    keep-alive requests, as a closed SDK client may leave), or any socket error on a connection
    the client dropped, is no failure of the server's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.errors: list[str] = []

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], OSError):
            self.errors.append(traceback.format_exc())


def _pieces(text: str, size: int = 40) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _send(h, status: int, ctype: str, data: bytes, headers: dict | None = None) -> None:
    h.send_response(status)
    h.send_header("content-type", ctype)
    h.send_header("content-length", str(len(data)))
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)


def _send_sse(h, events: list) -> None:
    chunks = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        chunks.append((f"event: {name}\n" if name else "") + f"data: {text}\n\n")
    data = "".join(chunks).encode()
    _send(h, 200, "text/event-stream", data, {"cache-control": "no-cache"})


# ---- helpers for scripts ------------------------------------------------------------------


def last_tool_results(body: dict) -> str:
    """The text of the tool results in the newest user message (either wire format)."""
    msgs = body.get("messages", [])
    if not msgs:
        return ""
    if "content" in msgs[-1] and isinstance(msgs[-1]["content"], list):  # anthropic
        return "\n".join(b.get("content", "") if isinstance(b.get("content"), str) else json.dumps(b.get("content"))
                         for b in msgs[-1]["content"] if b.get("type") == "tool_result")
    texts = []
    for m in reversed(msgs):  # openai: the trailing tool messages
        if m.get("role") != "tool":
            break
        texts.append(m.get("content") or "")
    return "\n".join(reversed(texts))


def system_text(body: dict) -> str:
    if "system" in body:
        return "\n".join(b["text"] for b in body["system"]) if isinstance(body["system"], list) else body["system"]
    return "\n".join(m["content"] for m in body.get("messages", []) if m.get("role") == "system")
