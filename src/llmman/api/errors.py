"""Rendering errors in each client's dialect.

Ollama routes answer ``{"error": "<text>"}``; OpenAI routes (``/v1/...``) answer
``{"error": {"message", "type", "param", "code"}}``. Both carry the real HTTP status and a
``Retry-After`` header when the error has one. Unexpected exceptions become a 500 with a generic
text (the traceback goes to the daemon log, never to the client).
"""

from __future__ import annotations

import logging

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from llmman.errors import LlmmanError
from llmman.protocol.openai import openai_error

log = logging.getLogger("llmman.api")


def is_openai_path(path: str) -> bool:
    """True for routes that speak the OpenAI dialect (everything under ``/v1/``)."""
    return path.startswith("/v1/")


def error_body(path: str, message: str, status: int, code: str | None = None) -> bytes:
    """The JSON error body for ``path``'s dialect."""
    if is_openai_path(path):
        return orjson.dumps(openai_error(message, status=status, code=code))
    return orjson.dumps({"error": message})


def error_response(path: str, message: str, status: int, *, code: str | None = None,
                   retry_after: float | None = None) -> Response:
    """A complete error response in ``path``'s dialect."""
    headers = {}
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, round(retry_after)))
    return Response(error_body(path, message, status, code), status_code=status,
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


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    """Last resort: log the traceback, answer 500 without it."""
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(request.url.path, "internal server error", 500)
