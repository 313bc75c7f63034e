"""Fixtures of the agent tests: loopback servers and scripted models live beside them."""

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture
def anthropic_key(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-loopback")
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    return "test-key-loopback"


@pytest.fixture
def openai_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key-loopback")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    return "test-key-loopback"


@dataclass(frozen=True)
class Sdk:
    """A live backend as the tests drive it: through its real SDK against the loopback server
    of its wire format (`name` is both), with a model agent/pricing.py prices."""

    name: str
    model: str
    base_url_env: str  # where the backend reads its base URL from the environment


SDKS = {"anthropic": Sdk("anthropic", "claude-sonnet-4-5-loopback", "ANTHROPIC_BASE_URL"),  # $3 / $15 per MTok
        "openai": Sdk("openai", "gpt-4o-loopback", "OPENAI_BASE_URL")}  # $2.5 / $10 per MTok


@pytest.fixture(params=sorted(SDKS))
def sdk(request):
    """Each SDK in turn, its key set (the anthropic_key / openai_key fixture)."""
    request.getfixturevalue(f"{request.param}_key")
    return SDKS[request.param]


@pytest.fixture
def fast_retry():
    from epiforge.agent.backends import RetryPolicy

    return RetryPolicy(max_retries=3, backoff_s=0.01, max_wait_s=0.05)


class Said(list):
    """What the loop printed, line by line."""

    def say(self, line: str) -> None:
        self.append(line)


@pytest.fixture
def said():
    return Said()
