"""Type tests and printing for JSON values, shared by the request validators (OpenAI and Anthropic):
a JSON ``true`` arrives as Python ``bool``, which is an ``int`` subclass and must not pass as a number."""

from __future__ import annotations

__all__ = ["is_int", "is_number", "json_number"]


def is_int(value: object) -> bool:
    """True for a JSON integer (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """True for a JSON number, integer or float (not a boolean)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def json_number(value: float) -> str:
    """A number as JSON would print it (integers in full, ``2147483647`` not ``2.14748e+09``)."""
    return str(value) if isinstance(value, int) or not value.is_integer() else str(int(value))
