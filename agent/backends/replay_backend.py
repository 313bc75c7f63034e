"""Replay: answer each step with the response recorded in a session log (no network), and
fork: the recorded responses up to a step, then a live backend from there on."""

from __future__ import annotations

from epiforge.agent.backends.base import Backend, ModelTurn, RecordingExhausted
from epiforge.agent.session import ModelResponse


class ReplayBackend(Backend):
    name = "replay"

    def __init__(self, events: list, *, upto_step: int | None = None):
        start = events[0]
        super().__init__(start.config.model)
        self.recorded_backend = start.config.backend
        self.responses = {e.step: e for e in events if isinstance(e, ModelResponse)}  # a re-asked step keeps its last answer
        self.upto_step = upto_step

    def info(self) -> dict:
        return {"backend": self.name, "model": self.model, "recorded_backend": self.recorded_backend,
                "recorded_steps": len(self.responses)}

    def has(self, step: int) -> bool:
        return step in self.responses and (self.upto_step is None or step < self.upto_step)

    def complete(self, system, messages, tools, *, step, on_retry=None, time_left=None) -> ModelTurn:
        if not self.has(step):
            raise RecordingExhausted(f"replay: the recording has no response for step {step}")
        r = self.responses[step]
        return ModelTurn(content=list(r.content), stop_reason=r.stop_reason, usage=r.usage, latency_s=0.0,
                         model=r.model, source="replay", cost_usd=r.cost_usd, notes=dict(r.notes))


class ForkBackend(Backend):
    """Recorded responses for steps < fork_at, then `live` (started when first needed)."""

    def __init__(self, replay: ReplayBackend, live: Backend, fork_at: int):
        super().__init__(live.model)
        self.name = live.name
        self.replay, self.live, self.fork_at = replay, live, fork_at

    def info(self) -> dict:
        return self.live.info() | {"forked_at_step": self.fork_at}

    def start(self, ctx) -> None:
        self.live.start(ctx)

    def ended(self, outcome: str, reason: str) -> None:
        self.live.ended(outcome, reason)

    def complete(self, system, messages, tools, *, step, on_retry=None, time_left=None) -> ModelTurn:
        if step < self.fork_at:
            return self.replay.complete(system, messages, tools, step=step, on_retry=on_retry)
        return self.live.complete(system, messages, tools, step=step, on_retry=on_retry, time_left=time_left)

    def close(self) -> None:
        self.live.close()
