"""``GET /llmman/requests`` (recent rows of the request log) and ``GET /llmman/stats`` (per model and node).

``/llmman/requests?model=&node=&status=&since=&limit=``: ``status`` is a code, ``error`` or ``ok``;
``since`` is unix seconds or a duration back from now (``15m``); ``limit`` defaults to 100 (at most 1000).
``/llmman/stats?window=1h``: the window back from now (a duration; default 1h). Both read this node's log
(llmman.obs.stats) in a thread. Answers: ``{"requests": [...]}`` and ``{"window": s, "since": t,
"stats": [...]}``; rows and stats are described in docs/observability.md.

``pool=1`` on either adds every up peer's answer to the same query (asked with ``pool`` left out, so it
never goes further): rows merged newest first and cut to ``limit``, stats concatenated (each names its
node) and sorted by model, then node. A peer that does not answer is left out (the pool view shows it
down). The dashboard (docs/dashboard.md) reads the whole pool this way from any node.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any
from urllib.parse import urlencode

import aiohttp
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.ollama_infer import json_response
from llmman.api.services import Services
from llmman.config.table import HostAddress
from llmman.durations import parse_duration
from llmman.errors import BadRequest, LlmmanError
from llmman.obs.stats import MAX_LIMIT, RowFilter, recent, stats

DEFAULT_WINDOW_S = 3600.0


def _seconds(text: str, what: str) -> float:
    """A non-negative duration query parameter (``1h``, ``90s``, ``300``)."""
    try:
        value = parse_duration(text, what=what)
    except BadRequest as exc:
        raise BadRequest(f"invalid {what}: {exc.message}") from None
    if value < 0 or value == float("inf"):
        raise BadRequest(f"invalid {what} {text!r}: expected a duration such as 1h or 15m")
    return value


def row_filter(params: dict[str, str], now: float) -> RowFilter:
    """The query parameters of ``/llmman/requests`` as a :class:`RowFilter`.

    Raises:
        BadRequest: a ``status``, ``since`` or ``limit`` that does not parse.
    """
    status: int | str | None = params.get("status") or None
    if isinstance(status, str) and status not in ("ok", "error"):
        if not status.isdigit():
            raise BadRequest(f"invalid status {status!r}: expected an HTTP status, 'ok' or 'error'")
        status = int(status)
    since: float | None = None
    if params.get("since"):
        text = params["since"]
        try:
            since = float(text)
        except ValueError:
            since = now - _seconds(text, "since")
    limit_text = params.get("limit") or "100"
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIMIT:
        raise BadRequest(f"invalid limit {limit_text!r}: expected 1 to {MAX_LIMIT}")
    return RowFilter(model=params.get("model") or None, node=params.get("node") or None, status=status,
                     since=since, limit=int(limit_text))


POOL = "pool"


def _pooled(params: dict[str, str]) -> bool:
    """True when the query asks for the whole pool (``pool=1``, ``true`` or ``yes``)."""
    return params.get(POOL, "").lower() in ("1", "true", "yes")


async def _peers(services: Services, path: str, params: dict[str, str], key: str) -> list[Any]:
    """The ``key`` list of every up peer's answer to ``path`` with ``params`` (less ``pool``)."""
    if not services.peers:
        return []
    peers = services.peers
    query = urlencode({k: v for k, v in params.items() if k != POOL})
    target = f"{path}?{query}" if query else path

    async def one(address: HostAddress) -> object:
        try:
            return await peers.get_json(address, target)
        except (OSError, aiohttp.ClientError, TimeoutError, ValueError):
            return None  # not marked down: a peer's unreadable log says nothing of its serving

    out: list[Any] = []
    for doc in await asyncio.gather(*(one(a) for a in peers.up())):
        items = doc.get(key) if isinstance(doc, dict) else None
        if isinstance(items, list):
            out += [item for item in items if isinstance(item, dict)]
    return out


def _unreadable(exc: sqlite3.Error) -> LlmmanError:
    return LlmmanError(f"the request log cannot be read: {exc}", status=503, code="request_log_unreadable")


async def requests(request: Request) -> Response:
    """``GET /llmman/requests``."""
    services: Services = request.app.state.services
    params = dict(request.query_params)
    which = row_filter(params, time.time())
    try:
        rows = await asyncio.to_thread(recent, services.obs.requests.path, which)
    except sqlite3.Error as exc:
        raise _unreadable(exc) from None
    if _pooled(params):
        rows += await _peers(services, "/llmman/requests", params, "requests")
        rows.sort(key=lambda row: row.get("time") or 0.0, reverse=True)
        rows = rows[:which.limit]
    return json_response({"requests": rows})


async def request_stats(request: Request) -> Response:
    """``GET /llmman/stats``."""
    services: Services = request.app.state.services
    params = dict(request.query_params)
    text = params.get("window")
    window = _seconds(text, "window") if text else DEFAULT_WINDOW_S
    since = time.time() - window
    try:
        summary = await asyncio.to_thread(stats, services.obs.requests.path, since)
    except sqlite3.Error as exc:
        raise _unreadable(exc) from None
    if _pooled(params):
        summary += await _peers(services, "/llmman/stats", params, "stats")
        summary.sort(key=lambda s: (str(s.get("model", "")), str(s.get("node", ""))))
    return json_response({"window": window, "since": since, "stats": summary})
