"""Any OpenAI-compatible /v1/chat/completions server (OpenAI, vLLM, Ollama, llama.cpp) through
the official openai SDK, with function tools, optionally streamed.

The base URL comes from --base-url or OPENAI_BASE_URL; the key from OPENAI_API_KEY. Local
servers usually need no key: then a placeholder is sent and a note says so, but the real
OpenAI endpoint without a key is an error, never a silent fallback.
"""

from __future__ import annotations

import json
import os
import time
from urllib.parse import urlparse

from epiforge.agent.backends.base import (
    Backend, BackendError, ModelTurn, RetryPolicy, request_timeout, retry_after, root_cause, with_retries,
)
from epiforge.agent.pricing import cost_usd
from epiforge.agent.session import Message, TextBlock, ToolUseBlock, Usage

OPENAI_URL = "https://api.openai.com/v1"


class OpenAIBackend(Backend):
    name = "openai"

    def __init__(self, model: str | None = None, *, base_url: str | None = None, max_output_tokens: int = 8192,
                 timeout_s: float = 600.0, retry: RetryPolicy | None = None, stream: bool = False,
                 note=print):
        if not model:
            raise BackendError("openai: --model is required (the name the server serves, e.g. qwen2.5-coder:32b)")
        super().__init__(model)
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL
        key = os.environ.get("OPENAI_API_KEY")
        if not key:
            if urlparse(self.base_url).hostname == "api.openai.com":
                raise BackendError("openai: OPENAI_API_KEY is not set (needed for api.openai.com; "
                                   "for a local server pass --base-url)")
            note(f"openai: OPENAI_API_KEY is not set; sending a placeholder key to {self.base_url}")
            key = "no-key"
        import openai  # only when this backend is used

        self.client = openai.OpenAI(api_key=key, base_url=self.base_url, timeout=timeout_s, max_retries=0)
        self.timeout_s = timeout_s
        self.max_output_tokens = max_output_tokens
        self.retry = retry or RetryPolicy()
        self.stream = stream

    def info(self) -> dict:
        from importlib.metadata import version

        return {"backend": self.name, "model": self.model, "base_url": self.base_url,
                "sdk": f"openai {version('openai')}", "stream": self.stream}

    def complete(self, system, messages, tools, *, step, on_retry=None, time_left=None) -> ModelTurn:
        request = dict(
            model=self.model,
            max_tokens=self.max_output_tokens,
            messages=[{"role": "system", "content": system}, *_wire_messages(messages)],
            tools=[{"type": "function", "function": {"name": t.name, "description": t.description,
                                                     "parameters": t.input_schema}} for t in tools],
        )
        turn = with_retries(lambda left: self._once(request | {"timeout": request_timeout(self.timeout_s, left)}, step),
                            _classify, self.retry, on_retry, reached=self.reached, time_left=time_left)
        self.reached = True
        return turn

    def _once(self, request: dict, step: int) -> ModelTurn:
        started = time.monotonic()
        if self.stream:
            text, calls, finish, usage, model = self._streamed(request)
        else:
            resp = self.client.chat.completions.create(**request)
            if not resp.choices:
                raise BackendError(f"openai: {self.base_url} answered with no choices")
            msg = resp.choices[0].message
            text, finish, model = msg.content or "", resp.choices[0].finish_reason, resp.model
            calls = [(c.id, c.function.name, c.function.arguments) for c in (msg.tool_calls or [])]
            usage = _usage(resp.usage)
        latency = time.monotonic() - started
        content = [TextBlock(text=text)] if text else []
        for i, (call_id, name, arguments) in enumerate(calls):
            content.append(ToolUseBlock(id=call_id or f"call_{step}_{i}", name=name or "", input=_arguments(arguments)))
        return ModelTurn(content=content, stop_reason=finish, usage=usage, latency_s=round(latency, 3),
                         model=model or self.model, cost_usd=cost_usd(model or self.model, usage))

    def _streamed(self, request: dict):
        """Accumulate a streamed completion: text deltas, tool-call deltas by index, usage."""
        text, calls, finish, usage, model = [], {}, None, Usage(), None
        stream = self.client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            model = chunk.model or model
            if chunk.usage:
                usage = _usage(chunk.usage)
            for choice in chunk.choices or []:
                delta = choice.delta
                if delta.content:
                    text.append(delta.content)
                for tc in delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                    slot["id"] = tc.id or slot["id"]
                    if tc.function:
                        slot["name"] += tc.function.name or ""
                        slot["arguments"] += tc.function.arguments or ""
                finish = choice.finish_reason or finish
        ordered = [(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())]
        return "".join(text), ordered, finish, usage, model

    def close(self) -> None:
        self.client.close()


def _arguments(raw: str | None) -> dict:
    """Tool arguments as a dict; broken JSON (small local models) reaches the tool as an error."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        return {"__invalid_json__": f"{e.msg} at char {e.pos}: {raw[:200]}"}
    return value if isinstance(value, dict) else {"__invalid_json__": f"expected an object, got {type(value).__name__}"}


def _usage(u) -> Usage:
    if u is None:
        return Usage()
    details = getattr(u, "prompt_tokens_details", None)
    cached = (getattr(details, "cached_tokens", None) or 0) if details else 0
    return Usage(input_tokens=(u.prompt_tokens or 0) - cached, output_tokens=u.completion_tokens or 0,
                 cache_read_tokens=cached)


def _wire_messages(messages: list[Message]) -> list[dict]:
    """Our Anthropic-shaped blocks as chat messages: tool_use -> assistant tool_calls,
    tool_result -> one "tool" message each (then any text as a user message)."""
    wire = []
    for m in messages:
        texts = [b.text for b in m.content if b.type == "text"]
        if m.role == "assistant":
            calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                     for b in m.content if b.type == "tool_use"]
            entry = {"role": "assistant", "content": "\n".join(texts) or None}
            if calls:
                entry["tool_calls"] = calls
            wire.append(entry)
            continue
        for b in m.content:
            if b.type == "tool_result":
                wire.append({"role": "tool", "tool_call_id": b.tool_use_id,
                             "content": ("ERROR: " if b.is_error else "") + b.content})
        if texts:
            wire.append({"role": "user", "content": "\n\n".join(texts)})
    return wire


def _classify(e: Exception) -> tuple[bool, str, float | None]:
    import openai

    if isinstance(e, openai.APITimeoutError):
        return True, "openai: the request timed out", None
    if isinstance(e, openai.APIConnectionError):
        url = str(getattr(getattr(e, "request", None), "url", "") or "the server")
        return True, f"openai: cannot reach {url} ({root_cause(e)})", None
    if isinstance(e, openai.APIStatusError):
        msg = (e.message or "").splitlines()[0] if e.message else ""
        retryable = e.status_code in (408, 409, 429) or e.status_code >= 500
        return retryable, f"openai: HTTP {e.status_code}: {msg}", retry_after(e.response.headers)
    raise e
