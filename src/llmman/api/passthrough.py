"""Answering with a child's own response, unchanged: the OpenAI-shaped routes (chat and text
completions, Responses) relay status, headers and body as llama-server sent them.

Before the first byte the child's real status goes to the client, except that a 500 which is really a
bad request (llama-server's request-conversion failures, :func:`llmman.protocol.openai.client_fault`)
becomes a 400; if the child dies mid-stream the route's own dialect renders one closing error event
(``error_event``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from llmman.api.cancel import unless_disconnected
from llmman.errors import LlmmanError
from llmman.gateway import UpstreamExchange
from llmman.protocol.openai import remap_upstream_error

log = logging.getLogger("llmman.api.passthrough")


async def relay(
    request: Request, exchange: UpstreamExchange, *, stream: bool, error_event: Callable[[LlmmanError], bytes]
) -> Response:
    """The client's response for ``exchange``: streamed as it comes when the client asked for a
    stream and the child answered 200, else read whole (abandoned if the client goes away)."""
    if stream and exchange.status == 200:
        return StreamingResponse(_chunks(exchange, error_event), status_code=200, headers=exchange.headers)
    data = await unless_disconnected(request, exchange.read())
    status, data = remap_upstream_error(exchange.status, data)
    return Response(data, status_code=status, headers=exchange.headers)


async def _chunks(
    exchange: UpstreamExchange, error_event: Callable[[LlmmanError], bytes]
) -> AsyncIterator[bytes]:
    try:
        async for chunk in exchange.chunks():
            yield chunk
    except LlmmanError as exc:
        log.warning("stream for %s ended with an error: %s", exchange.lease.reference, exc.message)
        yield error_event(exc)
    finally:
        exchange.close()
