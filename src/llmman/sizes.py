"""Byte sizes as people write them: ``24GB``, ``512MiB``, ``1.5 GiB``, ``0``.

Decimal units (``KB``, ``MB``, ``GB``, ``TB``) are powers of 1000 and binary units (``KiB``, ``MiB``,
``GiB``, ``TiB``) powers of 1024, as ``df -H`` / ``df -h`` write them; a bare number is bytes. Used by
the ``[resources]`` settings (``memory``, ``reserve``).
"""

from __future__ import annotations

import re

__all__ = ["format_bytes", "parse_size"]

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(raw: object) -> int:
    """Return ``raw`` in bytes: an int (bytes) or a string like ``24GB`` / ``512MiB`` / ``1.5GiB``.

    Raises:
        ValueError: a negative number, a bool, an unknown unit or anything that does not parse.
    """
    if isinstance(raw, bool):
        raise ValueError(f"expected a size such as 24GB, got {raw!r}")
    if isinstance(raw, int):
        if raw < 0:
            raise ValueError(f"a size cannot be negative, got {raw}")
        return raw
    if isinstance(raw, float) and raw >= 0:
        return int(raw)
    if not isinstance(raw, str):
        raise ValueError(f"expected a size such as 24GB, got {raw!r}")
    match = _SIZE.match(raw)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"expected a size such as 24GB or 512MiB, got {raw!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])



def format_bytes(n: int) -> str:
    """``n`` bytes for messages and logs: decimal units and the exact count, ``313.0 MB (313000000 B)``."""
    value = float(n)
    unit = "TB"
    for name in ("B", "KB", "MB", "GB"):
        if abs(value) < 1000:
            unit = name
            break
        value /= 1000
    text = f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
    return f"{text} ({n} B)" if unit != "B" else text
