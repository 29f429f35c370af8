"""Request-body limits (docs/security.md "Input limits"): a pure ASGI middleware.

- **Size** (``server.max_body_size``, 64 MiB): a ``Content-Length`` over the limit gets 413 in the route's
  dialect before a byte of the body is read; a body without one (chunked) is counted as it arrives and
  refused with 413 as soon as it passes the limit, so an oversized body is never buffered whole.
  ``POST /api/blobs/<digest>`` is exempt: uploads stream to disk (a GGUF is gigabytes).
- **Stalls** (``server.body_timeout``, 60 s): the longest wait for the next part of a body, on every
  route, uploads included. A client that stops sending gets 408 in the dialect. Once the body is
  complete ``receive`` is passed through untouched (a streaming answer waits on it for the disconnect).

Both answers carry ``Connection: close``: uvicorn then closes the connection instead of reading and
discarding the rest of a body, so a stalled or oversized client holds no descriptor.

Headers come before the app sees a request, so their bound is in the HTTP protocol instead
(:func:`header_timeout_protocol`, uvicorn's httptools protocol with a timer): a connection whose request
headers are not complete within ``server.body_timeout`` of it opening (or of the previous answer) is
closed. uvicorn has none (its keep-alive timeout runs only between requests, and stops at the first byte).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from llmman.api.errors import StartTracker, error_response

log = logging.getLogger("llmman.api")

#: Paths whose bodies are streamed to disk and not size-limited (the timeout still applies).
UNLIMITED_PREFIXES = ("/api/blobs/",)


class _Refused(Exception):
    """Raised inside ``receive`` to end the app's read of a body; answered by :class:`BodyLimits`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The request's ``Content-Length`` (None when absent or unreadable: the server judges it)."""
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def too_large(limit: int) -> str:
    """The 413 text."""
    return (f"request body too large: the limit is {limit} bytes (server.max_body_size, "
            "LLMMAN_MAX_BODY_SIZE); upload model files with POST /api/blobs")


class BodyLimits:
    """The middleware. ``max_size`` 0 means no size limit, ``timeout`` 0 (or inf) no stall timeout."""

    def __init__(self, app: ASGIApp, max_size: int, timeout: float) -> None:
        self.app = app
        self.max_size = max_size
        self.timeout = timeout if 0 < timeout < float("inf") else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        limit = 0 if path.startswith(UNLIMITED_PREFIXES) else self.max_size
        length = content_length(scope["headers"])
        if limit and length is not None and length > limit:
            await _answer(scope, send, 413, too_large(limit))
            return
        received = 0
        done = False

        async def limited_receive() -> Message:
            nonlocal received, done
            if done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout)
            except TimeoutError:
                raise _Refused(408, f"request body not received: nothing arrived for {self.timeout:g}s "
                                    "(server.body_timeout, LLMMAN_BODY_TIMEOUT)") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if limit and received > limit:
                    raise _Refused(413, too_large(limit))
                done = not message.get("more_body", False)
            else:
                done = True
            return message

        tracked = StartTracker(send)
        try:
            await self.app(scope, limited_receive, tracked)
        except _Refused as exc:
            log.info("%s %s: %s", scope["method"], path, exc.message)
            if not tracked.started:
                await _answer(scope, send, exc.status, exc.message)


async def _answer(scope: Scope, send: Send, status: int, message: str) -> None:
    """``status`` in the route's dialect, closing the connection (the rest of the body is never read)."""
    response = error_response(scope["path"], message, status)
    response.headers["connection"] = "close"

    async def no_body() -> Message:
        return {"type": "http.disconnect"}

    await response(scope, no_body, send)


def header_timeout_protocol(timeout: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, closing a connection whose request headers take more than ``timeout``
    seconds (0 or inf: never). Pass it as ``uvicorn.Config(http=...)``."""
    seconds = timeout if 0 < timeout < float("inf") else None

    class HeaderTimeout(HttpToolsProtocol):
        _headers_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            if seconds is not None:
                self._headers_timer = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._headers_timer is not None:
                self._headers_timer.cancel()
                self._headers_timer = None

        def _expired(self) -> None:
            self._headers_timer = None
            if not self.transport.is_closing():
                log.debug("closing a connection that sent no complete request headers for %gs", seconds)
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            pipelined = bool(self.pipeline)  # the next request's headers are already in
            super().on_response_complete()
            if not pipelined and not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeout
