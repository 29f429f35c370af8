"""Durations as Ollama reads them: ``keep_alive`` values, timeouts and grace periods.

The rules come from Ollama's ``api.Duration.UnmarshalJSON`` (``api/types.go``) and Go's
``time.ParseDuration``:

* a JSON number counts as seconds, fractions allowed; a negative number means *forever*;
* a string is a Go duration: an optional sign, then one or more ``<decimal><unit>`` pairs with units
  ``ns``, ``us`` (``µs``/``μs``), ``ms``, ``s``, ``m``, ``h`` (``"5m"``, ``"1h30m"``, ``"300ms"``,
  ``"-1m"``); ``"0"`` needs no unit; a negative duration means *forever*.

llmman is more lenient than Ollama in two ways: a bare number string (``"300"``, ``"1.5"``, ``"-1"``)
counts as seconds, as ``OLLAMA_KEEP_ALIVE`` already does for the environment; and ``"forever"`` (what
:func:`format_duration` shows) means forever. *Forever* is :data:`math.inf` seconds throughout llmman.
"""

from __future__ import annotations

import math
import re

from llmman.errors import BadRequest

__all__ = ["format_duration", "parse_duration"]

# Seconds per unit, as in Go's time package (``unitMap``).
_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5 micro sign
    "μs": 1e-6,  # U+03BC Greek small letter mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_PAIR = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([^\d.]*)")


def parse_duration(value: object, *, what: str = "keep_alive") -> float:
    """Return ``value`` as seconds (a float, :data:`math.inf` for forever).

    Args:
        value: an ``int``/``float`` (seconds; negative = forever) or a ``str`` (a Go duration such as
            ``"5m"`` or ``"1h30m"``, a bare number of seconds such as ``"300"``, or ``"forever"``;
            negative = forever).
            ``None`` is not accepted: an absent field is the caller's business.
        what: the name of the field or setting, used in error messages.

    Returns:
        Seconds, ``>= 0.0``, or ``math.inf``. ``-0`` and ``"-0s"`` are ``0.0`` (not forever).

    Raises:
        BadRequest: for a bool, ``None``, NaN or any other type (``unsupported type 'bool'``), and for a
            string Go cannot parse, with Go's own text (``time: invalid duration "abc"``,
            ``time: unknown unit "d" in duration "1d"``).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadRequest(f"invalid {what}: unsupported type '{type(value).__name__}'")
    if isinstance(value, int | float):
        if math.isnan(value):
            raise BadRequest(f"invalid {what}: not a number")
        return math.inf if value < 0 else float(value)
    return _parse_text(value)


def _parse_text(text: str) -> float:
    s = text.strip()
    quoted = f'"{text}"'
    if s.lower() == "forever":  # llmman leniency: what format_duration shows for math.inf
        return math.inf
    if _NUMBER.fullmatch(s):  # llmman leniency: bare seconds
        seconds = float(s)
        return math.inf if seconds < 0 else abs(seconds)
    negative = s.startswith("-")
    body = s[1:] if s[:1] in ("+", "-") else s
    if not body:
        raise BadRequest(f"time: invalid duration {quoted}")
    total = 0.0
    pos = 0
    while pos < len(body):
        match = _PAIR.match(body, pos)
        if match is None:
            raise BadRequest(f"time: invalid duration {quoted}")
        number, unit = match.group(1), match.group(2)
        if not unit:
            raise BadRequest(f"time: missing unit in duration {quoted}")
        if unit not in _UNITS:
            raise BadRequest(f'time: unknown unit "{unit}" in duration {quoted}')
        total += float(number) * _UNITS[unit]
        pos = match.end()
    if negative and total > 0:
        return math.inf
    return total


def format_duration(seconds: float) -> str:
    """Render seconds the way Go's ``time.Duration.String`` does, for display.

    ``300`` -> ``"5m0s"``, ``5400`` -> ``"1h30m0s"``, ``1.5`` -> ``"1.5s"``, ``0.3`` -> ``"300ms"``,
    ``0`` -> ``"0s"``; :data:`math.inf` or any negative value (both mean forever) -> ``"forever"``.
    The result parses back with :func:`parse_duration` to the same value (to the nanosecond).
    """
    if math.isnan(seconds):
        return "NaN"
    if math.isinf(seconds) or seconds < 0:
        return "forever"
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    if ns < 1_000:
        return f"{ns}ns"
    if ns < 1_000_000:
        return f"{_decimal(ns, 1_000)}µs"
    if ns < 1_000_000_000:
        return f"{_decimal(ns, 1_000_000)}ms"
    hours, rest = divmod(ns, 3_600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    secs = f"{_decimal(rest, 10**9)}s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    if minutes:
        return f"{minutes}m{secs}"
    return secs


def _decimal(value: int, unit: int) -> str:
    """``value / unit`` as a decimal string without trailing zeros (exact, no float rounding)."""
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    width = len(str(unit)) - 1
    return f"{whole}.{str(frac).rjust(width, '0').rstrip('0')}"
