"""Dollar cost of a model response: list prices per million tokens (input, output).

Cache writes cost 1.25x input and cache reads 0.1x input (Anthropic's prompt caching; an
OpenAI-compatible server's cached tokens are counted as reads). Unknown models (local
servers, command agents) have no price: their cost is None, never a guess, unless the
session gives its own (--price-in, --price-out).
"""

from __future__ import annotations

from epiforge.agent.session import Usage

#: model-name prefix -> (USD per MTok input, USD per MTok output); the longest prefix wins
PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "gpt-4o-mini": (0.15, 0.6),
    "gpt-4o": (2.5, 10.0),
    "gpt-4.1-mini": (0.4, 1.6),
    "gpt-4.1": (2.0, 8.0),
}


def price(model: str | None) -> tuple[float, float] | None:
    if not model:
        return None
    hits = [p for p in PRICES if model.startswith(p)]
    return PRICES[max(hits, key=len)] if hits else None


def session_price(config) -> tuple[float, float] | None:
    """A session's prices: its --price-in/--price-out when given, else the table's for its model."""
    if config.price_in is not None and config.price_out is not None:
        return config.price_in, config.price_out
    return price(config.model)


def cost_usd(model: str | None, usage: Usage, prices: tuple[float, float] | None = None) -> float | None:
    """Dollars for `usage` at `prices` (USD per MTok in, out), or at the table's price of `model`."""
    p = prices or price(model)
    if p is None:
        return None
    inp, out = p
    dollars = (usage.input_tokens * inp + usage.output_tokens * out
               + usage.cache_write_tokens * inp * 1.25 + usage.cache_read_tokens * inp * 0.1) / 1e6
    return round(dollars, 6)
