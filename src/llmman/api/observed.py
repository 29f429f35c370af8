"""Every inference answer reported once to the request log and the metrics (llmman.obs), whatever served it.

:class:`Observed` wraps the response :func:`llmman.api.inference.run` returns — a local answer, a peer's
(:class:`~llmman.api.relay.PeerAnswer`) or an error — in an ASGI response that watches what goes to the
client: the status, the time of the first body byte of a streamed answer (time to first token; a whole
JSON answer has none) and a sample of the bytes, from which the token counts and the speed the answer
reports are read in the client's dialect (:mod:`llmman.protocol.usage`). When the answer has ended,
however it ended, one row goes to
:meth:`Observer.request_done <llmman.obs.observer.Observer.request_done>`, which never blocks. With nothing
to report to (:attr:`Observer.active <llmman.obs.observer.Observer.active>` False: ``metrics.collect`` and
``log.requests`` both off) the answer is sent as it is, unwatched.

The per-chunk work is kept to a flag test and :meth:`AnswerSample.feed
<llmman.protocol.usage.AnswerSample.feed>` (a bounded copy); the answer is read (tokens, speed, error) once,
when it has ended.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from llmman.obs.observer import Observer
from llmman.obs.stopwatch import Stopwatch
from llmman.protocol.errors import dialect_of
from llmman.protocol.usage import AnswerSample, error_of, speed_of, usage_of

#: Content types of an answer sent as it is generated (its first body byte is its first token).
STREAMED_TYPES = (b"text/event-stream", b"application/x-ndjson")


def _streamed(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(k.lower() == b"content-type" and v.lower().startswith(STREAMED_TYPES) for k, v in headers)


@dataclass(frozen=True)
class Served:
    """What the pipeline knows of a request once it has an answer.

    Attributes:
        model: the model's full reference, else the name the client sent.
        kind: ``local``, ``forwarded`` or ``hop`` (served here for a peer).
        node: the node that served it (this node's name, or the peer's).
        conversation: the conversation key, if any.
    """

    model: str
    kind: str
    node: str
    conversation: str | None = None


class Observed(Response):
    """``inner`` sent as it is, reported to ``obs`` when it has ended."""

    def __init__(self, inner: Response, request: Request, obs: Observer, watch: Stopwatch,
                 served: Served) -> None:
        self._inner = inner
        self._request = request
        self._obs = obs
        self._watch = watch
        self._served = served
        self.status_code = inner.status_code
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._obs.active:
            await self._inner(scope, receive, send)
            return
        sample = AnswerSample()
        feed = sample.feed
        status = self._inner.status_code
        timing = False  # a streamed answer whose first body byte has not gone out yet

        def spy(message: Message) -> Awaitable[None]:  # not a coroutine: no frame of its own per chunk
            nonlocal status, timing
            if message["type"] == "http.response.body":
                body = message.get("body")
                if body:
                    if timing:
                        self._watch.first_token()
                        timing = False
                    feed(body)
            elif message["type"] == "http.response.start":
                status = int(message["status"])
                timing = _streamed(message.get("headers", []))
            return send(message)

        try:
            await self._inner(scope, receive, spy)
        finally:
            self._report(scope, status, sample)

    def _report(self, scope: Scope, status: int, sample: AnswerSample) -> None:
        served = self._served
        prompt, completion = usage_of(sample)
        path: str = scope["path"]
        client = scope.get("client")
        row = self._watch.row(
            node=served.node, route=path, dialect=dialect_of(path).value, model=served.model, status=status,
            prompt_tokens=prompt, completion_tokens=completion, client=client[0] if client else "",
            error=error_of(sample) if status >= 400 else "", kind=served.kind,
            conversation=served.conversation, speed=speed_of(sample))
        self._obs.request_done(row)
        if served.kind == "hop":
            self._obs.metrics.hop(row.client, "ok" if status < 400 else "error")

