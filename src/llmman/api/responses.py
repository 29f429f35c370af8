"""OpenAI Responses routes: ``POST /v1/responses`` (streaming and not) and ``/v1/responses/input_tokens``.

The body gets the Codex clean-ups of :mod:`llmman.protocol.openai.responses` and Ollama's capability checks
(function tools need ``tools``, ``input_image`` parts ``vision``; :func:`llmman.protocol.capabilities.
responses_needs`), then goes to the child's own route; status, headers and body (``event: response.*``
SSE when streaming) come back unchanged. Errors before the first byte come in the OpenAI shape with
their real status (a llama-server 500 that is really a bad request becomes a 400); if the child dies
mid-stream one ``event: error`` ends it.
"""

from __future__ import annotations

import logging

import orjson
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.cancel import unless_disconnected
from llmman.api.openai import bad_request
from llmman.api.passthrough import relay
from llmman.api.services import Services
from llmman.errors import LlmmanError, ModelNotFound
from llmman.protocol.capabilities import capability_error, responses_needs
from llmman.protocol.framing import sse
from llmman.protocol.openai.responses import clean_request

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
    if path == "/v1/responses":  # counting input tokens generates nothing: any model may count
        have = services.store.info(model.stored).capabilities
        refusal = capability_error(name, "chat", responses_needs(body), have)
        if refusal is not None:
            return bad_request(refusal)
    exchange = await unless_disconnected(request, services.gateway.open(model, path, orjson.dumps(body)))
    return await relay(request, exchange, stream=body.get("stream") is True, error_event=_error_event,
                       requested=name)


def _error_event(exc: LlmmanError) -> bytes:
    """A mid-stream failure as a Responses ``event: error``."""
    return sse({"type": "error", "code": exc.code, "message": exc.message, "param": None}, event="error")
