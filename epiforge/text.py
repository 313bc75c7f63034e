"""Wording shared by the commands' output."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """n and the noun in the number n takes: '1 turn', '2 turns', '0 results'."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
