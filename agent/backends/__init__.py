"""LLM backends: anthropic, openai (any OpenAI-compatible server), command (an external
coding-agent CLI), replay (a recorded session). Each SDK is imported only when its
backend is made, so light commands never pay for it."""

from __future__ import annotations

from epiforge.agent.backends.base import Backend, BackendError, ModelTurn, RecordingExhausted, RetryPolicy, ToolSpec

LIVE_BACKENDS = ("anthropic", "openai", "command")
#: a live backend's request (command: whole-run) timeout, and whether it streams, when not given
DEFAULT_TIMEOUT_S = {"anthropic": 600.0, "openai": 600.0, "command": 1800.0}
DEFAULT_STREAM = {"anthropic": True, "openai": False}


def make_backend(name: str, *, model: str | None = None, base_url: str | None = None, command: str | None = None,
                 max_output_tokens: int = 8192, timeout_s: float | None = None, retry: RetryPolicy | None = None,
                 stream: bool | None = None, note=print, sandbox: bool = True, sandbox_expose=()) -> Backend:
    """A live backend by name; a missing key or a missing option is a BackendError (one line)."""
    if name == "anthropic":
        from epiforge.agent.backends.anthropic_backend import AnthropicBackend

        return AnthropicBackend(model, base_url=base_url, max_output_tokens=max_output_tokens,
                                timeout_s=timeout_s or DEFAULT_TIMEOUT_S[name], retry=retry,
                                stream=DEFAULT_STREAM[name] if stream is None else stream)
    if name == "openai":
        from epiforge.agent.backends.openai_backend import OpenAIBackend

        return OpenAIBackend(model, base_url=base_url, max_output_tokens=max_output_tokens,
                             timeout_s=timeout_s or DEFAULT_TIMEOUT_S[name], retry=retry,
                             stream=DEFAULT_STREAM[name] if stream is None else stream, note=note)
    if name == "command":
        from epiforge.agent.backends.command_backend import CommandBackend

        return CommandBackend(command, model, timeout_s=timeout_s or DEFAULT_TIMEOUT_S[name], note=note, sandbox=sandbox,
                              expose=sandbox_expose)
    raise BackendError(f"unknown backend {name!r}; live backends: {', '.join(LIVE_BACKENDS)} (replay: epiforge replay LOG)")


__all__ = ["Backend", "BackendError", "DEFAULT_STREAM", "DEFAULT_TIMEOUT_S", "LIVE_BACKENDS", "ModelTurn", "RecordingExhausted", "RetryPolicy", "ToolSpec",
           "make_backend"]
