"""OpenAI Responses routes: ``POST /v1/responses`` (streaming and not) and ``/v1/responses/input_tokens``.

The body gets the Codex clean-ups of :mod:`llmman.protocol.responses`, then goes to the child's own
route; status, headers and body (``event: response.*`` SSE when streaming) come back unchanged. Errors
before the first byte come in the OpenAI shape with their real status; if the child dies mid-stream
one ``event: error`` ends it.
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
from llmman.protocol.responses import clean_request

log = logging.getLogger("llmman.api.responses")


async def responses(request: Request) -> Response:
    """``POST /v1/responses``."""
    return await _forward(request, "/v1/responses")


async def input_tokens(request: Request) -> Response:
    """``POST /v1/responses/input_tokens``: ``{"object": "response.input_tokens", "input_tokens": N}``."""
    return await _forward(request, "/v1/responses/input_tokens")


async def _forward(request: Request, path: str) -> Response:
    services: Services = request.app.state.services
    body, name = clean_request(await request.body())
    try:
        model = services.gateway.resolve(name)
    except ModelNotFound as exc:
        raise LlmmanError(f"model '{name}' not found", status=404, code="model_not_found") from exc
    exchange = await unless_disconnected(request, services.gateway.open(model, path, orjson.dumps(body)))
    if body.get("stream") is True and exchange.status == 200:
        return StreamingResponse(_passthrough(exchange), status_code=200, headers=exchange.headers)
    data = await unless_disconnected(request, exchange.read())
    return Response(data, status_code=exchange.status, headers=exchange.headers)


async def _passthrough(exchange: UpstreamExchange) -> AsyncIterator[bytes]:
    try:
        async for chunk in exchange.chunks():
            yield chunk
    except LlmmanError as exc:
        log.warning("stream for %s ended with an error: %s", exchange.lease.reference, exc.message)
        yield sse({"type": "error", "code": exc.code, "message": exc.message, "param": None}, event="error")
    finally:
        exchange.close()
