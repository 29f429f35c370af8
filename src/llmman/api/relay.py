"""Relaying an answer to the client: a child's stream through a transducer, or a peer's bytes as they are.

:func:`passthrough` is the answer of the OpenAI-shaped routes, which relay the child's own answer.

:func:`stream_answer` is the one loop every streamed local answer runs in (and the one place its headers
are set: ``Cache-Control: no-cache`` and ``X-Accel-Buffering: no``, so nginx and similar proxies pass each
event on as it comes instead of buffering the answer): the child's chunks go through
the dialect's :class:`~llmman.protocol.transducer.Transducer`; a break (:class:`LlmmanError`, e.g. the
child died mid-answer) ends the stream with the transducer's in-band frame, anything unexpected with
the same frame saying ``internal server error`` (logged, never a traceback to the client); the lease
and the connection are released in ``finally``.

:class:`PeerAnswer` streams a peer's answer back unchanged as it comes, naming the node that served it
(``x-llmman-node``: the peer's own header, else the peer's name); a gap of ``aggregation.stall_timeout``
probes the peer (cluster/forward.py :class:`~llmman.cluster.forward.WatchedAnswer`), and a peer that fails,
stays silent without answering its probe, or sends nothing for ``server.load_timeout`` mid-answer gets
one in-band frame in the dialect of the route; a client that goes away closes the upstream connection,
which cancels the work on the peer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping

import aiohttp
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from llmman.api.cancel import unless_disconnected
from llmman.cluster.forward import NODE, RESPONSE_DROP, Alive, WatchedAnswer, header_value
from llmman.errors import LlmmanError
from llmman.gateway import UpstreamExchange
from llmman.protocol.errors import Dialect
from llmman.protocol.model_echo import ModelEcho
from llmman.protocol.openai.shapes import remap_upstream_error
from llmman.protocol.openai.stream import Kind, OpenAIStream, fix_arguments
from llmman.protocol.transducer import Passthrough, Transducer

log = logging.getLogger("llmman.api.relay")


#: The headers of every streamed answer: not buffered by a proxy (nginx reads ``X-Accel-Buffering``), not
#: cached.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_STREAM_KEYS = {key.lower() for key in STREAM_HEADERS}


def stream_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """``headers`` (the child's, say) with :data:`STREAM_HEADERS` in place of any of their own spelling."""
    kept = {key: value for key, value in (headers or {}).items() if key.lower() not in _STREAM_KEYS}
    return {**kept, **STREAM_HEADERS}


def stream_answer(exchange: UpstreamExchange, transducer: Transducer, *, media_type: str | None = None,
                  headers: Mapping[str, str] | None = None,
                  chunks: AsyncIterator[bytes] | None = None) -> Response:
    """A 200 streaming response of ``exchange``'s body (or ``chunks``, a route's reading of it) through
    ``transducer``, with :data:`STREAM_HEADERS`."""
    return StreamAnswer(exchange, transducer, chunks, media_type=media_type, headers=stream_headers(headers))


async def _until_disconnected(pump: Coroutine[object, object, None], receive: Receive,
                              close: Callable[[], object]) -> BaseException | None:
    """Run ``pump`` (an answer's sending loop) until it ends or the client disconnects, whichever is first;
    the other is cancelled and ``close`` called in any case. The pump's own exception, or None (it ended, or
    the disconnect cancelled it)."""
    task = asyncio.ensure_future(pump)
    watch = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watch):
            t.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
        close()
    return None if task.cancelled() else task.exception()


class StreamAnswer(Response):
    """A local child's answer through a transducer, streamed to the client as it comes (an ASGI response).

    One loop reads the child's chunks, feeds them to the transducer and sends what comes out, one send
    per chunk read, with no async generator or task group between the read and the send (the cost per
    event is what a GPU child's one-event reads pay, issue 17). The client's disconnect cancels the loop;
    the exchange is closed in any case.
    """

    def __init__(self, exchange: UpstreamExchange, transducer: Transducer,
                 chunks: AsyncIterator[bytes] | None, *, media_type: str | None,
                 headers: Mapping[str, str]) -> None:
        self._exchange = exchange
        self._transducer = transducer
        self._chunks = chunks
        self.status_code = 200
        if media_type is not None:
            self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        failed = await _until_disconnected(self._pump(send), receive, self._exchange.close)
        if failed is not None:
            raise failed  # a send that failed, as StreamingResponse lets it

    async def _pump(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        exchange, transducer = self._exchange, self._transducer
        feed = transducer.feed
        following = (self._chunks if self._chunks is not None else exchange.chunks()).__anext__
        try:
            last = False
            while not last:
                try:
                    try:
                        out = feed(await following())
                    except StopAsyncIteration:
                        out, last = transducer.close(), True
                except LlmmanError as exc:
                    log.warning("stream for %s ended with an error: %s", exchange.lease.reference,
                                exc.message)
                    out, last = transducer.error(exc), True
                except Exception as exc:  # an in-band error rather than a torn stream, never a traceback
                    log.exception("stream for %s failed", exchange.lease.reference, exc_info=exc)
                    out, last = transducer.error(LlmmanError("internal server error")), True
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        finally:
            exchange.close()
        await send({"type": "http.response.body", "body": b""})


class PeerAnswer(Response):
    """A peer's answer, streamed to the client as it comes (an ASGI response).

    Args:
        response: the peer's open response (status line received).
        frame: the in-band error frame for a message, in the route's dialect.
        broke: called with why, when the peer failed or stalled after its first byte.
        name: the peer's name, for the in-band message and ``x-llmman-node`` when the peer sends none.
        alive: asks the peer whether it is still there (its probe), after ``stall`` seconds of silence.
        stall: seconds of silence mid-answer before ``alive`` is asked; 0 = never.
        finished: called once when the answer has ended, however it ended (the forward's accounting).
    """

    def __init__(self, response: aiohttp.ClientResponse, frame: Callable[[str], bytes],
                 broke: Callable[[str], None], name: str, *, alive: Alive | None = None,
                 stall: float = 0.0, finished: Callable[[], object] | None = None) -> None:
        self._upstream = response
        self._frame = frame
        self._broke = broke
        self._name = name
        self._alive = alive
        self._stall = stall if alive is not None else 0.0
        self._finished = finished
        self.status_code = response.status
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # An answer read to its end has already given its keep-alive connection back to the pool (aiohttp
        # does at EOF), so close() only closes a connection cut short, cancelling the peer's work.
        await _until_disconnected(self._pump(send), receive, self.close)

    def close(self) -> None:
        """Release the peer's connection and end the forward's accounting (idempotent); for an answer
        that is never sent too."""
        self._upstream.close()
        finished, self._finished = self._finished, None
        if finished is not None:
            finished()

    @property
    def upstream(self) -> aiohttp.ClientResponse:
        """The peer's open response (the pipeline reads an unload's answer whole from it)."""
        return self._upstream

    @property
    def node(self) -> str:
        """The node that served this answer: the peer's own ``x-llmman-node``, else its name."""
        return self._upstream.headers.get(NODE) or self._name

    def headers_out(self) -> list[tuple[bytes, bytes]]:
        """The peer's headers as sent on: hop-by-hop ones dropped, ``x-llmman-node`` added when the
        peer did not name itself."""
        headers = [(k, v) for k, v in self._upstream.raw_headers
                   if k.decode("latin-1").lower() not in RESPONSE_DROP]
        if not any(k.decode("latin-1").lower() == NODE for k, _ in headers):
            headers.append((NODE.encode(), header_value(self._name).encode("latin-1")))
        return headers

    async def _pump(self, send: Send) -> None:
        upstream = self._upstream
        await send({"type": "http.response.start", "status": upstream.status, "headers": self.headers_out()})
        answer = WatchedAnswer(upstream.content, self._alive or _always, self._stall,
                               what=f"peer {self._name} silent mid-answer")
        following = answer.next
        try:
            while chunk := await following():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            what = "stalled" if isinstance(exc, TimeoutError) else "failed"  # timeout: silent too long
            self._broke(f"{what} mid-answer: {exc or type(exc).__name__}")
            frame = self._frame(f"peer {self._name} {what} mid-answer")
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        finally:
            answer.close()
        await send({"type": "http.response.body", "body": b""})


async def _always() -> bool:
    return True


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def passthrough(request: Request, exchange: UpstreamExchange, *, stream: bool, dialect: Dialect,
                      requested: str, kind: Kind | None = None, usage_chunk: bool = False) -> Response:
    """A child's own answer, relayed (OpenAI chat and text completions, Responses): streamed as it comes
    when the client asked for a stream and the child answered 200, else read whole (abandoned if the
    client goes away). Before the first byte the child's real status goes to the client, except that a
    500 which is really a bad request becomes a 400 (:func:`remap_upstream_error`). The changes to the
    bytes: the child's ``"model":"<alias>"`` (the lease's reference, its ``-a``) becomes ``requested``,
    the name the client sent, as Ollama echoes the request's model; and for an answer of ``kind``, what
    :class:`~llmman.protocol.openai.stream.OpenAIStream` fixes (``usage_chunk``: a text completion asked
    for ``stream_options.include_usage``), or for a whole answer object tool arguments made strings."""
    echo = ModelEcho.between(exchange.lease.reference, requested)
    if stream and exchange.status == 200:
        fix = OpenAIStream(kind, usage_chunk=usage_chunk) if kind is not None else None
        return stream_answer(exchange, Passthrough(dialect, echo, fix), headers=exchange.headers)
    data = await unless_disconnected(request, exchange.read())
    if echo is not None:
        data = echo.feed(data) + echo.flush()
    if exchange.status == 200 and kind is not None:
        data = fix_arguments(data)
    status, data = remap_upstream_error(exchange.status, data)
    return Response(data, status_code=status, headers=exchange.headers)
