"""Answering with a child's own response, unchanged: the OpenAI-shaped routes (chat and text
completions, Responses) relay status, headers and body as llama-server sent them.

Before the first byte the child's real status goes to the client, except that a 500 which is really a
bad request (llama-server's request-conversion failures, :func:`llmman.protocol.openai.client_fault`)
becomes a 400; if the child dies mid-stream the route's own dialect renders one closing error event
(``error_event``). The one change to the bytes: the child's ``"model":"<alias>"`` becomes the name the
client sent when that differs (:mod:`llmman.protocol.model_echo`), as Ollama echoes the request's model.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from llmman.api.cancel import unless_disconnected
from llmman.errors import LlmmanError
from llmman.gateway import UpstreamExchange
from llmman.protocol.model_echo import ModelEcho
from llmman.protocol.openai.shapes import remap_upstream_error

log = logging.getLogger("llmman.api.passthrough")


async def relay(
    request: Request,
    exchange: UpstreamExchange,
    *,
    stream: bool,
    error_event: Callable[[LlmmanError], bytes],
    requested: str | None = None,
) -> Response:
    """The client's response for ``exchange``: streamed as it comes when the client asked for a
    stream and the child answered 200, else read whole (abandoned if the client goes away).
    ``requested`` is the model name the client sent, echoed in place of the child's alias (the lease's
    reference, which the child was started with as ``-a``); None keeps the bytes as they are."""
    echo = ModelEcho.between(exchange.lease.reference, requested) if requested is not None else None
    if stream and exchange.status == 200:
        return StreamingResponse(_chunks(exchange, error_event, echo), status_code=200,
                                 headers=exchange.headers)
    data = await unless_disconnected(request, exchange.read())
    if echo is not None:
        data = echo.feed(data) + echo.flush()
    status, data = remap_upstream_error(exchange.status, data)
    return Response(data, status_code=status, headers=exchange.headers)


async def _chunks(
    exchange: UpstreamExchange, error_event: Callable[[LlmmanError], bytes], echo: ModelEcho | None
) -> AsyncIterator[bytes]:
    try:
        async for chunk in exchange.chunks():
            out = chunk if echo is None else echo.feed(chunk)
            if out:
                yield out
        if echo is not None and (tail := echo.flush()):
            yield tail
    except LlmmanError as exc:
        log.warning("stream for %s ended with an error: %s", exchange.lease.reference, exc.message)
        yield error_event(exc)
    finally:
        exchange.close()
