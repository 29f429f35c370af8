"""``GET /llmman/requests`` (recent rows of the request log) and ``GET /llmman/stats`` (per model and node).

``/llmman/requests?model=&node=&status=&since=&limit=``: ``status`` is a code, ``error`` or ``ok``;
``since`` is unix seconds or a duration back from now (``15m``); ``limit`` defaults to 100 (at most 1000).
``/llmman/stats?window=1h``: the window back from now (a duration; default 1h). Both read this node's log
(llmman.obs.stats) in a thread. Answers: ``{"requests": [...]}`` and ``{"window": s, "since": t,
"stats": [...]}``; rows and stats are described in docs/observability.md.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time

from starlette.requests import Request
from starlette.responses import Response

from llmman.api.ollama_infer import json_response
from llmman.api.services import Services
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


def _unreadable(exc: sqlite3.Error) -> LlmmanError:
    return LlmmanError(f"the request log cannot be read: {exc}", status=503, code="request_log_unreadable")


async def requests(request: Request) -> Response:
    """``GET /llmman/requests``."""
    services: Services = request.app.state.services
    which = row_filter(dict(request.query_params), time.time())
    try:
        rows = await asyncio.to_thread(recent, services.obs.requests.path, which)
    except sqlite3.Error as exc:
        raise _unreadable(exc) from None
    return json_response({"requests": rows})


async def request_stats(request: Request) -> Response:
    """``GET /llmman/stats``."""
    services: Services = request.app.state.services
    text = request.query_params.get("window")
    window = _seconds(text, "window") if text else DEFAULT_WINDOW_S
    since = time.time() - window
    try:
        summary = await asyncio.to_thread(stats, services.obs.requests.path, since)
    except sqlite3.Error as exc:
        raise _unreadable(exc) from None
    return json_response({"window": window, "since": since, "stats": summary})
