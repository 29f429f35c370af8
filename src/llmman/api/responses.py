"""OpenAI Responses routes: ``POST /v1/responses`` (streaming and not) and ``/v1/responses/input_tokens``.

The body gets the Codex clean-ups of :mod:`llmman.protocol.openai.responses` and Ollama's capability
checks (function tools need ``tools``, ``input_image`` parts ``vision``;
:func:`llmman.protocol.capabilities.responses_needs`), then goes through the pipeline (api/inference.py)
and, served here, to the child's own route; status, headers and body (``event: response.*`` SSE when
streaming) come back unchanged. Errors before the first byte come in the OpenAI shape with their real
status (a llama-server 500 that is really a bad request becomes a 400); if the child dies mid-stream one
``event: error`` ends it.
"""

from __future__ import annotations

import logging
from functools import partial

import orjson
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.cancel import unless_disconnected
from llmman.api.inference import Call, run
from llmman.api.openai import bad_request
from llmman.api.relay import passthrough
from llmman.api.services import Services
from llmman.gateway import ResolvedModel
from llmman.protocol.capabilities import capability_error, responses_needs
from llmman.protocol.conversation import conversation_key
from llmman.protocol.errors import Dialect
from llmman.protocol.openai.responses import clean_request
from llmman.protocol.openai.stream import Kind

log = logging.getLogger("llmman.api.responses")


async def responses(request: Request) -> Response:
    """``POST /v1/responses``."""
    return await _forward(request, "/v1/responses")


async def input_tokens(request: Request) -> Response:
    """``POST /v1/responses/input_tokens``: ``{"object": "response.input_tokens", "input_tokens": N}``."""
    return await _forward(request, "/v1/responses/input_tokens")


async def _forward(request: Request, path: str) -> Response:
    body, name = clean_request(await request.body())
    conversation = conversation_key(name, body.get("input"), body.get("instructions"))
    return await run(request, Call(name, partial(_serve, request, path, body, name),
                                   conversation=conversation))


async def _serve(request: Request, path: str, body: dict[str, object], name: str,
                 model: ResolvedModel) -> Response:
    """The local step: capabilities, then the cleaned body to the child's own route."""
    services: Services = request.app.state.services
    if path == "/v1/responses":  # counting input tokens generates nothing: any model may count
        have = services.store.info(model.stored).capabilities
        refusal = capability_error(name, "chat", responses_needs(body), have)
        if refusal is not None:
            return bad_request(refusal)
    exchange = await unless_disconnected(request, services.gateway.open(model, path, orjson.dumps(body)))
    kind = Kind.RESPONSES if path == "/v1/responses" else None
    return await passthrough(request, exchange, stream=body.get("stream") is True, dialect=Dialect.RESPONSES,
                             requested=name, kind=kind)
