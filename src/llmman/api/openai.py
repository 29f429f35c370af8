"""OpenAI routes: ``/v1/chat/completions``, ``/v1/completions`` passed to llama-server byte for
byte (streaming included), and ``/v1/models`` from the store.

Only ``model`` and ``stream`` are read from the body; the original bytes go upstream and the
child's status, headers and body come back unchanged. If the child dies mid-stream the client
gets one SSE ``data: {"error": ...}`` event, as llama-server itself reports late errors.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from llmman.api.cancel import unless_disconnected
from llmman.api.services import Services
from llmman.errors import LlmmanError, ModelNotFound
from llmman.gateway import UpstreamExchange
from llmman.protocol.framing import sse
from llmman.protocol.openai import models_list, openai_error, peek_model

log = logging.getLogger("llmman.api.openai")


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    return await _proxy(request, "/v1/chat/completions")


async def completions(request: Request) -> Response:
    """``POST /v1/completions``."""
    return await _proxy(request, "/v1/completions")


async def _proxy(request: Request, path: str) -> Response:
    services: Services = request.app.state.services
    raw = await request.body()
    body, name = peek_model(raw)
    try:
        model = await services.gateway.ensure(name)
    except ModelNotFound as exc:
        raise LlmmanError(exc.message, status=404, code="model_not_found") from exc
    content_type = request.headers.get("content-type", "application/json")
    # A client that goes away stops the wait (a non-streamed answer arrives only when it is complete).
    opening = services.gateway.open(model, path, raw, content_type=content_type)
    exchange = await unless_disconnected(request, opening)
    if body.get("stream") is True and exchange.status == 200:
        return StreamingResponse(
            _passthrough(exchange), status_code=exchange.status, headers=exchange.headers
        )
    data = await unless_disconnected(request, exchange.read())
    return Response(data, status_code=exchange.status, headers=exchange.headers)


async def _passthrough(exchange: UpstreamExchange) -> AsyncIterator[bytes]:
    try:
        async for chunk in exchange.chunks():
            yield chunk
    except LlmmanError as exc:
        log.warning("stream for %s ended with an error: %s", exchange.lease.reference, exc.message)
        yield sse(openai_error(exc.message, status=exc.status, code=exc.code))
    finally:
        exchange.close()


async def models(request: Request) -> Response:
    """``GET /v1/models``: every stored model, with ``context_length`` and ``max_model_len``."""
    services: Services = request.app.state.services
    entries = []
    for model in services.store.list():
        try:
            ctx = services.store.info(model).context_length
        except Exception:
            ctx = None
        entries.append({"id": model.reference, "created": int(model.modified_at),
                        "context_length": int(ctx) if ctx else None})
    return Response(orjson.dumps(models_list(entries)), media_type="application/json")
