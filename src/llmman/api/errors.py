"""Error responses in each client's dialect (the bodies are rendered by llmman.protocol.errors).

Ollama routes answer ``{"error": "<text>"}``; Anthropic routes (``/v1/messages``) answer
``{"type": "error", "error": {"type", "message"}}``; other OpenAI routes (``/v1/...``) answer
``{"error": {"message", "type", "param", "code"}}``. All carry the real HTTP status and a
``Retry-After`` header when the error has one. Unexpected exceptions become a 500 with a generic
text (the traceback goes to the daemon log, never to the client).
"""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmman.errors import LlmmanError
from llmman.protocol.errors import dialect_of, error_body

log = logging.getLogger("llmman.api")


def error_response(path: str, message: str, status: int, *, code: str | None = None,
                   retry_after: float | None = None) -> Response:
    """A complete error response in ``path``'s dialect."""
    headers = {}
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, round(retry_after)))
    return Response(error_body(dialect_of(path), message, status, code), status_code=status,
                    media_type="application/json", headers=headers)


async def handle_llmman_error(request: Request, exc: Exception) -> Response:
    """Starlette exception handler for :class:`LlmmanError`."""
    assert isinstance(exc, LlmmanError)
    if exc.status >= 500:
        log.warning("%s %s: %s", request.method, request.url.path, exc.message)
    return error_response(request.url.path, exc.message, exc.status, code=exc.code,
                          retry_after=exc.retry_after)


async def handle_http_error(request: Request, exc: Exception) -> Response:
    """Starlette exception handler for routing errors (404 unknown path, 405 wrong method)."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"{request.method} {request.url.path} not found"
    elif exc.status_code == 405:
        message = f"method {request.method} not allowed for {request.url.path}"
    else:
        message = str(exc.detail)
    return error_response(request.url.path, message, exc.status_code)


def unexpected_message(exc: BaseException) -> str:
    """What a client is told about an error llmman did not anticipate: an OS error's own words
    (e.g. ``Read-only file system: /store/index.json``), else a generic text; never a traceback."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return "internal server error"


class StartTracker:
    """Wraps an ASGI ``send`` and remembers whether the response has started (its status line went
    out), so a middleware knows whether it may still answer with an error of its own."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


class CatchAll:
    """The safety net inside the CORS/Host guard (a pure ASGI middleware): an exception no handler took
    becomes a 500 in the route's dialect, logged with its traceback, and is NOT re-raised, so uvicorn keeps
    the client's kept-alive connection usable. A client that hung up mid-body is only logged at debug."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracked = StartTracker(send)
        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:
            log.debug("%s %s: the client went away while sending its body", scope["method"], scope["path"])
        except Exception as exc:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"], exc_info=exc)
            if not tracked.started:
                await error_response(scope["path"], unexpected_message(exc), 500)(scope, receive, send)
