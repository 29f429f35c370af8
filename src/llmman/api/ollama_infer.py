"""Ollama inference routes: ``POST /api/chat`` and ``POST /api/generate``.

The body is parsed once (:mod:`llmman.protocol.ollama.request`) into a streaming llama-server request
and goes through the pipeline (api/inference.py). Served here, a derived model's defaults and
Ollama's thinking default apply (no ``think`` to a thinking model means ``think: true``), the
capabilities are checked, and the child's SSE answer becomes NDJSON lines
(:class:`~llmman.protocol.ollama.ndjson.OllamaNdjson`; ``stream`` true, the default) or one aggregated
object (``stream: false``). An empty prompt or ``messages`` loads the model, or unloads it with a zero
``keep_alive``. A prompt the child refuses as longer than its context is cut to fit and sent again
(api/ollama_fit.py, Ollama's rules in protocol/ollama/truncate.py), or refused with Ollama's 400 when the
request says ``truncate: false``. ``/api/generate`` with a ``suffix`` runs on the child's ``/infill``
(protocol/ollama/infill.py) for a model with the ``insert`` capability. Errors before the first byte get
their real status; after it, one ``{"error": ...}`` line ends the stream.
"""

from __future__ import annotations

import time
from functools import partial

import orjson
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.cancel import unless_disconnected
from llmman.api.derived import ollama_with_defaults
from llmman.api.inference import Call, run
from llmman.api.ollama_fit import fitted
from llmman.api.relay import stream_answer
from llmman.api.services import Services
from llmman.cluster.router import Intent
from llmman.errors import BadRequest, UpstreamError
from llmman.gateway import ResolvedModel, UpstreamExchange
from llmman.protocol.capabilities import capability_error, check_capabilities
from llmman.protocol.conversation import conversation_key
from llmman.protocol.errors import upstream_text
from llmman.protocol.ollama.fields import parse_json_body
from llmman.protocol.ollama.infill import InfillStream
from llmman.protocol.ollama.ndjson import OllamaNdjson
from llmman.protocol.ollama.request import (
    INFILL_PATH,
    UpstreamRequest,
    chat_request,
    generate_request,
    with_default_think,
)
from llmman.protocol.ollama.stream import OllamaStream, load_response
from llmman.protocol.ollama.timestamps import CreatedAt
from llmman.protocol.ollama.truncate import REFUSAL, overflow
from llmman.protocol.openai.shapes import client_fault

NDJSON = "application/x-ndjson"


created_at = CreatedAt()  # Ollama's created_at, formatted once a millisecond (protocol/ollama/timestamps.py)


def json_response(obj: object, status: int = 200) -> Response:
    """A single JSON object answer, ``application/json; charset=utf-8``."""
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json; charset=utf-8")


async def chat(request: Request) -> Response:
    """``POST /api/chat``."""
    started = time.monotonic_ns()
    body = parse_json_body(await request.body())
    return await _infer(request, body, chat_request(body), started)


async def generate(request: Request) -> Response:
    """``POST /api/generate``."""
    started = time.monotonic_ns()
    body = parse_json_body(await request.body())
    return await _infer(request, body, generate_request(body), started)


async def _infer(request: Request, body: dict[str, object], upstream: UpstreamRequest,
                 started_ns: int) -> Response:
    """Through the pipeline; an unload only looks in the store (a missing model is 404 at once, as in
    Ollama). Raises BadRequest for a malformed ``keep_alive``."""
    intent = Intent.UNLOAD if upstream.unloads else Intent.INFER
    serve = partial(_serve, request, body, upstream, started_ns)
    return await run(request, Call(upstream.model, serve, intent,
                                   conversation=conversation_key(upstream.model, body.get("messages"))))


async def _serve(request: Request, body: dict[str, object], upstream: UpstreamRequest, started_ns: int,
                 model: ResolvedModel) -> Response:
    """The local step: defaults, capabilities, then load/unload or generate on the child."""
    services: Services = request.app.state.services
    gateway = services.gateway
    upstream = ollama_with_defaults(services.store, model.stored, body, upstream)  # a derived model's
    have = services.store.info(model.stored).capabilities
    upstream = with_default_think(upstream, have)
    check_capabilities(upstream.model, upstream.kind, upstream.body, upstream.think, have)
    if upstream.path == INFILL_PATH and (missing := capability_error(upstream.model, "generate", ("insert",),
                                                                     have)):
        raise BadRequest(missing)  # before loading, as Ollama checks the capabilities
    keep_alive = upstream.keep_alive_s
    num_ctx = upstream.runner.num_ctx

    if upstream.is_load:
        if upstream.unloads:
            await services.scheduler.unload(model.stored.reference)
            return json_response(load_response(upstream.kind, upstream.model, created_at(), "unload"))
        lease = await gateway.acquire(model, keep_alive=keep_alive, num_ctx=num_ctx,
                                     options=upstream.runner)
        lease.release()
        return json_response(load_response(upstream.kind, upstream.model, created_at(), "load"))

    # A client that goes away stops the wait and the generation (a streamed answer is cancelled by
    # Starlette itself once it has started).
    body, load_ns = upstream.body, None
    while True:
        payload = orjson.dumps(body)
        opening = gateway.open(model, upstream.path, payload, keep_alive=keep_alive, num_ctx=num_ctx,
                               options=upstream.runner)
        exchange = await unless_disconnected(request, opening)
        if load_ns is None:  # the first try's: it waited for the load
            load_ns = int(exchange.lease.load_duration * 1e9)
        if exchange.status == 200:
            break
        data = await exchange.read()
        over = overflow(exchange.status, data)
        if over is not None and (not upstream.truncate or body is not upstream.body):
            raise BadRequest(REFUSAL)  # truncate: false, or still too long once cut
        if over is None:
            text = upstream_text(data)
            raise UpstreamError(text, 400 if client_fault(exchange.status, text) else exchange.status)
        body = await fitted(request, model, upstream, over)
    stream = InfillStream if upstream.path == INFILL_PATH else OllamaStream
    transducer = OllamaNdjson(stream(upstream.kind, upstream.model, created_at),
                              lambda: time.monotonic_ns() - started_ns, load_ns)
    if upstream.stream:
        return stream_answer(exchange, transducer, media_type=NDJSON)
    try:
        await unless_disconnected(request, _drain(exchange, transducer))
    finally:
        exchange.close()
    total_ns = time.monotonic_ns() - started_ns
    return json_response(transducer.stream.single(total_duration_ns=total_ns, load_duration_ns=load_ns))


async def _drain(exchange: UpstreamExchange, transducer: OllamaNdjson) -> None:
    """Feed the whole upstream answer to ``transducer`` (for ``stream: false``)."""
    async for chunk in exchange.chunks():
        transducer.feed(chunk)
    transducer.drain()
