"""OpenAI routes: ``/v1/chat/completions``, ``/v1/completions`` passed to llama-server byte for
byte (streaming included), and ``/v1/models`` from the store.

Only ``model`` and ``stream`` are read from the body; the original bytes go upstream and the
child's status, headers and body come back unchanged. If the child dies mid-stream the client
gets one SSE ``data: {"error": ...}`` event, as llama-server itself reports late errors.
"""

from __future__ import annotations

import logging

import orjson
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.cancel import unless_disconnected
from llmman.api.passthrough import relay
from llmman.api.services import Services
from llmman.errors import LlmmanError, ModelNotFound
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
    return await relay(request, exchange, stream=body.get("stream") is True, error_event=_error_event)


def _error_event(exc: LlmmanError) -> bytes:
    """A mid-stream failure as llama-server reports one: ``data: {"error": {...}}``."""
    return sse(openai_error(exc.message, status=exc.status, code=exc.code))


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
