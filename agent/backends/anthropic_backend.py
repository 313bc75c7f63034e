"""The Anthropic Messages API through the official SDK: tool use, streaming, prompt caching.

The knowledge pack (system prompt, after the tool definitions) carries a cache breakpoint,
so every turn after the first reads it from the cache; a second breakpoint on the newest
message caches the growing conversation. The SDK's own retries are off: ours (base.py)
log each one. The key comes from ANTHROPIC_API_KEY only.
"""

from __future__ import annotations

import os
import time

from epiforge.agent.backends.base import (
    Backend, BackendError, ModelTurn, RetryPolicy, request_timeout, retry_after, root_cause, with_retries,
)
from epiforge.agent.pricing import cost_usd
from epiforge.agent.session import Message, TextBlock, ToolUseBlock, Usage

DEFAULT_MODEL = "claude-sonnet-4-5"
_RETRY_TYPES = {"overloaded_error", "rate_limit_error", "api_error", "timeout_error"}


class AnthropicBackend(Backend):
    name = "anthropic"

    def __init__(self, model: str | None = None, *, base_url: str | None = None, max_output_tokens: int = 8192,
                 timeout_s: float = 600.0, retry: RetryPolicy | None = None, stream: bool = True):
        super().__init__(model or DEFAULT_MODEL)
        key = os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise BackendError("anthropic: ANTHROPIC_API_KEY is not set (export it, or choose another --backend)")
        import anthropic  # the SDK costs ~1 s to import: only when this backend is used

        self.base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
        self.client = anthropic.Anthropic(api_key=key, base_url=self.base_url, timeout=timeout_s, max_retries=0)
        self.timeout_s = timeout_s
        self.max_output_tokens = max_output_tokens
        self.retry = retry or RetryPolicy()
        self.stream = stream

    def info(self) -> dict:
        from importlib.metadata import version

        return {"backend": self.name, "model": self.model, "base_url": self.base_url,
                "sdk": f"anthropic {version('anthropic')}", "stream": self.stream}

    def complete(self, system, messages, tools, *, step, on_retry=None, time_left=None) -> ModelTurn:
        request = dict(
            model=self.model,
            max_tokens=self.max_output_tokens,
            system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            tools=[{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in tools],
            messages=_wire_messages(messages),
        )
        turn = with_retries(lambda left: self._once(request | {"timeout": request_timeout(self.timeout_s, left)}),
                            _classify, self.retry, on_retry, reached=self.reached, time_left=time_left)
        self.reached = True
        return turn

    def _once(self, request: dict) -> ModelTurn:
        started = time.monotonic()
        if self.stream:
            with self.client.messages.stream(**request) as stream:
                final = stream.get_final_message()
        else:
            final = self.client.messages.create(**request)
        latency = time.monotonic() - started
        content = []
        for block in final.content:
            if block.type == "text":
                content.append(TextBlock(text=block.text))
            elif block.type == "tool_use":
                content.append(ToolUseBlock(id=block.id, name=block.name, input=dict(block.input or {})))
        u = final.usage
        usage = Usage(input_tokens=u.input_tokens or 0, output_tokens=u.output_tokens or 0,
                      cache_read_tokens=getattr(u, "cache_read_input_tokens", None) or 0,
                      cache_write_tokens=getattr(u, "cache_creation_input_tokens", None) or 0)
        return ModelTurn(content=content, stop_reason=final.stop_reason, usage=usage, latency_s=round(latency, 3),
                         model=final.model, cost_usd=cost_usd(final.model or self.model, usage))

    def close(self) -> None:
        self.client.close()


def _wire_messages(messages: list[Message]) -> list[dict]:
    """Our blocks are the Messages API's; add a cache breakpoint on the newest block."""
    wire = [m.model_dump(exclude_none=True) for m in messages]
    if wire and wire[-1]["content"]:
        wire[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return wire


def _classify(e: Exception) -> tuple[bool, str, float | None]:
    import anthropic

    if isinstance(e, anthropic.APITimeoutError):
        return True, "anthropic: the request timed out", None
    if isinstance(e, anthropic.APIConnectionError):
        url = str(getattr(getattr(e, "request", None), "url", "") or "the server")
        return True, f"anthropic: cannot reach {url} ({root_cause(e)})", None
    if isinstance(e, anthropic.APIStatusError):
        kind = getattr(e, "type", None) or ""
        msg = getattr(e, "api_message", None) or str(e).splitlines()[0]
        retryable = e.status_code in (408, 409, 429) or e.status_code >= 500 or kind in _RETRY_TYPES
        return retryable, f"anthropic: HTTP {e.status_code} {kind}: {msg}".replace(" : ", ": "), retry_after(e.response.headers)
    raise e  # anything else is a bug, not an API failure: let it surface
