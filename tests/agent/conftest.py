"""Fixtures of the agent tests: loopback servers and scripted models live beside them."""

import sys
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


@pytest.fixture
def fast_retry():
    from agent.backends import RetryPolicy

    return RetryPolicy(max_retries=3, backoff_s=0.01, max_wait_s=0.05)


class Said(list):
    """What the loop printed, line by line."""

    def say(self, line: str) -> None:
        self.append(line)


@pytest.fixture
def said():
    return Said()
