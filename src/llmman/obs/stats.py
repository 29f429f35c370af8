"""Reading the request log (llmman.obs.requestlog): recent rows with filters, and per model and node stats.

Each reader opens its own read-only connection (``mode=ro``), so reads never wait for the writer thread
and never create the file; a log that does not exist yet reads as empty. Both are synchronous: the routes
run them in a thread. Percentiles are nearest-rank over the window's rows.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmman.obs.requestlog import COLUMNS

MAX_LIMIT = 1000


@dataclass(frozen=True)
class RowFilter:
    """Which rows :func:`recent` returns: exact ``model`` and ``node``, ``status`` (a code, ``error`` for
    4xx/5xx or an error message, ``ok`` for the rest), rows at or after unix time ``since``, newest first,
    at most ``limit``."""

    model: str | None = None
    node: str | None = None
    status: int | str | None = None
    since: float | None = None
    limit: int = 100


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[sqlite3.Connection | None]:
    """A read-only connection to the log at ``path``, or None when it does not exist (yet)."""
    if not path.is_file():
        yield None
        return
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    try:
        yield conn
    finally:
        conn.close()


def recent(path: Path, which: RowFilter) -> list[dict[str, Any]]:
    """The rows ``which`` selects, newest first, as ``{"id": ..., COLUMNS...}`` objects."""
    where: list[str] = []
    args: list[object] = []
    for column, value in (("model", which.model), ("node", which.node)):
        if value:
            where.append(f"{column} = ?")
            args.append(value)
    if which.status == "error":
        where.append("(status >= 400 OR error != '')")
    elif which.status == "ok":
        where.append("(status < 400 AND error = '')")
    elif isinstance(which.status, int):
        where.append("status = ?")
        args.append(which.status)
    if which.since is not None:
        where.append("time >= ?")
        args.append(which.since)
    sql = (f"SELECT id, {', '.join(COLUMNS)} FROM requests"
           f"{' WHERE ' + ' AND '.join(where) if where else ''} ORDER BY time DESC, id DESC LIMIT ?")
    args.append(max(1, min(which.limit, MAX_LIMIT)))
    with read_only(path) as conn:
        if conn is None:
            return []
        cursor = conn.execute(sql, args)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile of sorted ``values`` (``fraction`` 0..1); None when empty."""
    if not values:
        return None
    rank = max(1, math.ceil(fraction * len(values)))
    return values[min(rank, len(values)) - 1]


def stats(path: Path, since: float, until: float | None = None) -> list[dict[str, Any]]:
    """Per model and node over ``[since, until)``: requests, errors, tokens in and out, average and peak
    tokens/s, p50/p95 time to first token and latency (seconds). Sorted by model, then node."""
    sql = ("SELECT model, node, status, error, prompt_tokens, completion_tokens, tokens_per_s, ttft, "
           "duration FROM requests WHERE time >= ?" + (" AND time < ?" if until is not None else ""))
    groups: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    with read_only(path) as conn:
        if conn is None:
            return []
        for row in conn.execute(sql, (since,) if until is None else (since, until)):
            groups.setdefault((row[0], row[1]), []).append(row)
    return [_summary(model, node, rows) for (model, node), rows in sorted(groups.items())]


def _summary(model: str, node: str, rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    speeds = [r[6] for r in rows if r[6] is not None]
    ttfts = sorted(r[7] for r in rows if r[7] is not None)
    latencies = sorted(r[8] for r in rows)
    return {
        "model": model,
        "node": node,
        "requests": len(rows),
        "errors": sum(1 for r in rows if r[2] >= 400 or r[3]),
        "tokens_in": sum(r[4] or 0 for r in rows),
        "tokens_out": sum(r[5] or 0 for r in rows),
        "tokens_per_s_avg": sum(speeds) / len(speeds) if speeds else None,
        "tokens_per_s_peak": max(speeds) if speeds else None,
        "ttft_p50": percentile(ttfts, 0.5),
        "ttft_p95": percentile(ttfts, 0.95),
        "latency_p50": percentile(latencies, 0.5),
        "latency_p95": percentile(latencies, 0.95),
    }
