"""Anthropic routes: ``POST /v1/messages`` (streaming and not) and ``POST /v1/messages/count_tokens``.

The body is checked and normalised by :mod:`llmman.protocol.anthropic`, then sent to the child's own
``/v1/messages`` (or ``/v1/messages/count_tokens``); answers are fixed up (id, model, ping, errors)
by the same module. Errors before the first byte carry their real status in Anthropic's shape
(api/errors.py picks the shape by path); after it, one ``error`` event ends the stream.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from llmman.api.cancel import unless_disconnected
from llmman.api.services import Services
from llmman.errors import BadRequest, LlmmanError
from llmman.gateway import UpstreamExchange
from llmman.protocol.anthropic import AnthropicStream, fix_message, prepare_request, upstream_error
from llmman.protocol.framing import SSEDecoder

log = logging.getLogger("llmman.api.anthropic")

JSON = "application/json"


def _parse(raw: bytes) -> object:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"The request body is not valid JSON: {exc}") from None


async def messages(request: Request) -> Response:
    """``POST /v1/messages``."""
    return await _forward(request, "/v1/messages")


async def count_tokens(request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}`` from the model's own tokenizer."""
    return await _forward(request, "/v1/messages/count_tokens")


async def _forward(request: Request, path: str) -> Response:
    services: Services = request.app.state.services
    body, name = prepare_request(_parse(await request.body()))
    model = services.gateway.resolve(name)
    stream = body.get("stream") is True and path == "/v1/messages"
    exchange = await unless_disconnected(request, services.gateway.open(model, path, orjson.dumps(body)))
    if exchange.status != 200:
        status, err = upstream_error(exchange.status, await exchange.read())
        return Response(orjson.dumps(err), status_code=status, media_type=JSON)
    if stream:
        headers = {"Cache-Control": "no-cache"}
        return StreamingResponse(_events(exchange, AnthropicStream(name)), media_type="text/event-stream",
                                 headers=headers)
    data = await unless_disconnected(request, exchange.read())
    try:
        answer = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise LlmmanError("llama-server sent an answer that is not JSON") from exc
    if path == "/v1/messages" and isinstance(answer, dict):
        answer = fix_message(answer, name)
    return Response(orjson.dumps(answer), media_type=JSON)


async def _events(exchange: UpstreamExchange, transducer: AnthropicStream) -> AsyncIterator[bytes]:
    decoder = SSEDecoder()
    try:
        async for chunk in exchange.chunks():
            for event in decoder.feed(chunk):
                out = transducer.feed(event)
                if out:
                    yield out
        for event in decoder.close():
            out = transducer.feed(event)
            if out:
                yield out
        tail = transducer.close()
        if tail:
            yield tail
    except LlmmanError as exc:
        log.warning("stream for %s ended with an error: %s", exchange.lease.reference, exc.message)
        yield transducer.error(exc.message, exc.status)
    except Exception as exc:  # an in-band error rather than a torn stream, never a traceback
        log.exception("stream for %s failed", exchange.lease.reference, exc_info=exc)
        yield transducer.error("internal server error")
    finally:
        exchange.close()
