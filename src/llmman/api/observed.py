"""Every inference answer reported once to the request log and the metrics (llmman.obs), whatever served it.

:class:`Observed` wraps the response :func:`llmman.api.inference.run` returns — a local answer, a peer's
(:class:`~llmman.api.relay.PeerAnswer`) or an error — in an ASGI response that watches what goes to the
client: the status, the time of the first body byte (time to first token; for a non-streamed answer, the
whole answer's) and a sample of the bytes, from which the token counts are read in the client's dialect
(:mod:`llmman.protocol.usage`). When the answer has ended, however it ended, one row goes to
:meth:`Observer.request_done <llmman.obs.observer.Observer.request_done>`, which never blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from llmman.obs.observer import Observer
from llmman.obs.stopwatch import Stopwatch
from llmman.protocol.errors import dialect_of
from llmman.protocol.usage import AnswerSample, error_of, usage_of


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
        sample = AnswerSample()
        status = self._inner.status_code

        async def spy(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and message.get("body"):
                self._watch.first_token()
                sample.feed(message["body"])
            await send(message)

        try:
            await self._inner(scope, receive, spy)
        finally:
            self._report(status, sample)

    def _report(self, status: int, sample: AnswerSample) -> None:
        request, served = self._request, self._served
        prompt, completion = usage_of(sample)
        path = request.url.path
        row = self._watch.row(
            node=served.node, route=path, dialect=dialect_of(path).value, model=served.model, status=status,
            prompt_tokens=prompt, completion_tokens=completion,
            client=request.client.host if request.client else "",
            error=error_of(sample) if status >= 400 else "", kind=served.kind,
            conversation=served.conversation)
        self._obs.request_done(row)
        if served.kind == "hop":
            self._obs.metrics.hop(row.client, "ok" if status < 400 else "error")

