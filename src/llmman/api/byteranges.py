"""``Range`` request headers for the ``/v2/`` blob route, per RFC 9110 §14.1-14.2.

A header that is not a valid ``bytes`` ranges-specifier (bad syntax, another unit, an ``int-range`` whose
last position is before its first) is ignored: the whole representation is sent with 200. A valid one
whose ranges are all unsatisfiable (every first position at or past the end, or only ``-0`` suffixes)
is a 416. Otherwise the satisfiable ranges are kept, clamped to the size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SPEC = re.compile(r"(\d+)-(\d*)|-(\d+)")


@dataclass(frozen=True)
class RangeDecision:
    """What to do with a request's ``Range``: ``ranges`` None means ignore it (send everything);
    an empty tuple means 416; else the satisfiable ``(first, last)`` byte positions, inclusive."""

    ranges: tuple[tuple[int, int], ...] | None

    @property
    def unsatisfiable(self) -> bool:
        return self.ranges == ()

    def header(self) -> str | None:
        """The equivalent, normalised ``Range`` value (None when the header is to be ignored)."""
        if not self.ranges:
            return None
        return "bytes=" + ",".join(f"{a}-{b}" for a, b in self.ranges)


def decide(value: str | None, size: int) -> RangeDecision:
    """Classify ``value`` (the raw ``Range`` header, or None) against a representation of ``size``
    bytes. Never raises."""
    if value is None:
        return RangeDecision(None)
    unit, sep, specs = value.partition("=")
    if not sep or unit.strip().lower() != "bytes":
        return RangeDecision(None)
    parsed: list[tuple[int | None, int | None]] = []
    for part in specs.split(","):
        part = part.strip(" \t")
        if not part:
            continue  # RFC 9110 §5.6.1: empty list elements are ignored
        m = _SPEC.fullmatch(part)
        if m is None:
            return RangeDecision(None)
        if m[3] is not None:
            parsed.append((None, int(m[3])))
            continue
        start, end = int(m[1]), int(m[2]) if m[2] else None
        if end is not None and end < start:
            return RangeDecision(None)
        parsed.append((start, end))
    if not parsed:
        return RangeDecision(None)
    kept: list[tuple[int, int]] = []
    for first, last in parsed:
        if first is None:  # suffix: the last ``last`` bytes
            if last and size:
                kept.append((max(0, size - last), size - 1))
        elif first < size:
            kept.append((first, size - 1 if last is None else min(last, size - 1)))
    return RangeDecision(tuple(kept))
