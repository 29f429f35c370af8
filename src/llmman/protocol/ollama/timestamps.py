"""Ollama's ``created_at`` stamp, formatted once per millisecond.

Every line of an Ollama stream carries ``created_at`` (RFC 3339 UTC with ``Z``); formatting a
``datetime`` for each line is a visible part of the cost per token at GPU speed (issue 17), so
:class:`CreatedAt` keeps the text of the current millisecond and makes a new one only when the clock has
moved on: every line of the same millisecond has the same stamp, as close to now as a millisecond. The
clock is injected (default :func:`time.time_ns`); no other I/O here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

__all__ = ["CreatedAt", "stamp"]


def stamp(ms: int) -> str:
    """Milliseconds since the epoch as ``datetime.isoformat`` writes them in UTC, ``Z`` for ``+00:00``
    (microseconds, six digits, left out only at a whole second, as ``isoformat`` does)."""
    whole = datetime.fromtimestamp(ms // 1000, UTC).replace(microsecond=ms % 1000 * 1000)
    return whole.isoformat().replace("+00:00", "Z")


class CreatedAt:
    """A ``created_at()`` clock: now as :func:`stamp` text, made at most once per millisecond."""

    def __init__(self, now_ns: Callable[[], int] = time.time_ns) -> None:
        self._now_ns = now_ns
        self._ms = -1
        self._text = ""

    def __call__(self) -> str:
        ms = self._now_ns() // 1_000_000
        if ms != self._ms:
            self._ms, self._text = ms, stamp(ms)
        return self._text
