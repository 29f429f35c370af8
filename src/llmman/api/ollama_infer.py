"""Ollama inference routes: ``POST /api/chat`` and ``POST /api/generate``.

The body is translated by :mod:`llmman.protocol.ollama.fields` into a streaming llama-server request (with
Ollama's thinking default: no ``think`` to a thinking model means ``think: true``);
the answer's SSE events are fed through an :class:`~llmman.protocol.ollama.OllamaStream`
transducer into NDJSON lines (``stream`` true, the default) or one aggregated object
(``stream: false``). Errors before the first byte get their real status; after it, one
``{"error": ...}`` line ends the stream (reference/ollama.md §1.5).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from llmman.api.cancel import unless_disconnected
from llmman.api.derived import ollama_with_defaults
from llmman.api.services import Services
from llmman.durations import parse_duration
from llmman.errors import LlmmanError
from llmman.gateway import Gateway, ResolvedModel, UpstreamExchange
from llmman.protocol.capabilities import check_capabilities
from llmman.protocol.framing import SSEDecoder, ndjson
from llmman.protocol.ollama.fields import parse_json_body
from llmman.protocol.ollama.request import UpstreamRequest, chat_request, generate_request, with_default_think
from llmman.protocol.ollama.stream import OllamaStream, error_line, load_response
from llmman.protocol.openai.shapes import client_fault

log = logging.getLogger("llmman.api.ollama")

NDJSON = "application/x-ndjson"


def created_at() -> str:
    """Now as RFC 3339 UTC with ``Z`` and microseconds, Ollama's ``created_at``."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


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


async def _find(gateway: Gateway, upstream: UpstreamRequest) -> ResolvedModel:
    """The model ``upstream`` names, pulled on demand (:meth:`Gateway.ensure`) unless the request is an
    unload (``keep_alive`` 0 with nothing to generate): that only looks in the store, so a missing model is
    404 ``model '<name>' not found`` at once, as in Ollama. Raises ModelNotFound, or BadRequest for a
    malformed ``keep_alive``."""
    if upstream.is_load and upstream.keep_alive is not None and parse_duration(upstream.keep_alive) == 0:
        return gateway.resolve(upstream.model)
    return await gateway.ensure(upstream.model)


async def _infer(request: Request, body: dict[str, object], upstream: UpstreamRequest,
                 started_ns: int) -> Response:
    services: Services = request.app.state.services
    gateway = services.gateway
    model = await _find(gateway, upstream)  # the one lookup (and pull) of this request
    upstream = ollama_with_defaults(services.store, model.stored, body, upstream)  # a derived model's
    have = services.store.info(model.stored).capabilities
    upstream = with_default_think(upstream, have)
    check_capabilities(upstream.model, upstream.kind, upstream.body, upstream.think, have)
    keep_alive = None if upstream.keep_alive is None else parse_duration(upstream.keep_alive)
    num_ctx = upstream.runner.num_ctx

    if upstream.is_load:
        if keep_alive == 0:
            await services.scheduler.unload(model.stored.reference)
            return json_response(load_response(upstream.kind, upstream.model, created_at(), "unload"))
        lease = await gateway.acquire(model, keep_alive=keep_alive, num_ctx=num_ctx)
        lease.release()
        return json_response(load_response(upstream.kind, upstream.model, created_at(), "load"))

    # A client that goes away stops the wait and the generation (a streamed answer is cancelled by
    # Starlette itself once it has started).
    payload = orjson.dumps(upstream.body)
    exchange = await unless_disconnected(
        request, gateway.open(model, upstream.path, payload, keep_alive=keep_alive, num_ctx=num_ctx)
    )
    if exchange.status != 200:
        text = _upstream_error_text(await exchange.read())
        raise LlmmanError(text, status=400 if client_fault(exchange.status, text) else exchange.status)
    transducer = OllamaStream(upstream.kind, upstream.model, created_at)
    load_ns = int(exchange.lease.load_duration * 1e9)
    if not upstream.stream:
        try:
            await unless_disconnected(request, _drain(exchange, transducer))
        finally:
            exchange.close()
        total_ns = time.monotonic_ns() - started_ns
        return json_response(transducer.single(total_duration_ns=total_ns, load_duration_ns=load_ns))
    return StreamingResponse(_ndjson_lines(exchange, transducer, started_ns, load_ns), media_type=NDJSON)


async def _drain(exchange: UpstreamExchange, transducer: OllamaStream) -> None:
    """Feed the whole upstream answer to ``transducer`` (for ``stream: false``)."""
    async for _ in _objects(exchange, transducer):
        pass


async def _objects(exchange: UpstreamExchange, transducer: OllamaStream) -> AsyncIterator[dict[str, object]]:
    """Ollama objects for each upstream SSE event, as they arrive."""
    decoder = SSEDecoder()
    async for chunk in exchange.chunks():
        for event in decoder.feed(chunk):
            for obj in _feed(transducer, event.data):
                yield obj
    for event in decoder.close():
        for obj in _feed(transducer, event.data):
            yield obj


def _feed(transducer: OllamaStream, data: str) -> list[dict[str, object]]:
    if not data or data == "[DONE]":
        return []
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        log.debug("skipping a malformed upstream event: %.200s", data)
        return []
    if not isinstance(chunk, dict):
        return []
    return transducer.feed(chunk)


async def _ndjson_lines(
    exchange: UpstreamExchange, transducer: OllamaStream, started_ns: int, load_ns: int
) -> AsyncIterator[bytes]:
    try:
        async for obj in _objects(exchange, transducer):
            yield ndjson(obj)
        total_ns = time.monotonic_ns() - started_ns
        yield ndjson(transducer.final(total_duration_ns=total_ns, load_duration_ns=load_ns))
    except LlmmanError as exc:
        log.warning("stream for %s ended with an error: %s", exchange.lease.reference, exc.message)
        yield ndjson(error_line(exc.message))
    except Exception as exc:  # an in-band error rather than a torn stream, never a traceback
        log.exception("stream for %s failed", exchange.lease.reference, exc_info=exc)
        yield ndjson(error_line("internal server error"))
    finally:
        exchange.close()


def _upstream_error_text(body: bytes) -> str:
    """The message of a llama-server error body ``{"error": {"message": ...}}``, or the raw text."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip() or "llama-server returned an error"
    if isinstance(parsed, dict):
        err = parsed.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return body.decode("utf-8", "replace")
