"""Embedding routes: ``POST /api/embed``, ``/api/embeddings`` (Ollama) and ``/v1/embeddings`` (OpenAI,
passed byte for byte). All run on the model's embedding child (``--embeddings``, ModelPlan.embedding),
started beside any chat child of the same model. Translation: :mod:`llmman.protocol.embeddings`.
"""

from __future__ import annotations

import time

import orjson
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.cancel import unless_disconnected
from llmman.api.services import Services
from llmman.durations import parse_duration
from llmman.errors import LlmmanError, ModelNotFound
from llmman.protocol.embeddings import (
    EmbedRequest,
    embed_request,
    legacy_request,
    ollama_embed_response,
    shorten_answer,
    vectors,
)
from llmman.protocol.ollama import parse_json_body
from llmman.protocol.openai import openai_error, peek_model, remap_upstream_error
from llmman.protocol.openai_validate import InvalidParam, validate_embeddings

JSON = "application/json; charset=utf-8"


async def _embed(request: Request, req: EmbedRequest) -> tuple[list[list[float]], int, int]:
    """Run ``req`` on the embedding child: ``(vectors, prompt tokens, load ns)``."""
    services: Services = request.app.state.services
    model = services.gateway.resolve(req.model)
    keep_alive = None if req.keep_alive is None else parse_duration(req.keep_alive)
    if not req.inputs:
        lease = await services.gateway.acquire(model, keep_alive=keep_alive, num_ctx=None, embedding=True)
        lease.release()
        return [], 0, int(lease.load_duration * 1e9)
    opening = services.gateway.open(model, "/v1/embeddings", orjson.dumps(req.upstream()),
                                    keep_alive=keep_alive, embedding=True)
    exchange = await unless_disconnected(request, opening)
    load_ns = int(exchange.lease.load_duration * 1e9)
    data = await unless_disconnected(request, exchange.read())
    try:
        answer = orjson.loads(data)
    except orjson.JSONDecodeError:
        answer = None
    if exchange.status != 200:
        err = answer.get("error") if isinstance(answer, dict) else None
        message = err.get("message") if isinstance(err, dict) else None
        status = 400 if exchange.status >= 500 and "too large" in str(message) else exchange.status
        raise LlmmanError(str(message or data.decode("utf-8", "replace")), status=status)
    embeddings, tokens = vectors(answer, req.dimensions)
    return embeddings, tokens, load_ns


async def embed(request: Request) -> Response:
    """``POST /api/embed``."""
    started = time.monotonic_ns()
    req = embed_request(parse_json_body(await request.body()))
    embeddings, tokens, load_ns = await _embed(request, req)
    body = ollama_embed_response(req.model, embeddings, prompt_tokens=tokens,
                                 total_ns=time.monotonic_ns() - started, load_ns=load_ns)
    return Response(orjson.dumps(body), media_type=JSON)


async def embeddings_legacy(request: Request) -> Response:
    """``POST /api/embeddings``: ``{"embedding": [...]}``."""
    req = legacy_request(parse_json_body(await request.body()))
    vecs, _, _ = await _embed(request, req)
    return Response(orjson.dumps({"embedding": vecs[0] if vecs else []}), media_type=JSON)


async def v1_embeddings(request: Request) -> Response:
    """``POST /v1/embeddings``: the original bytes to the embedding child, its answer unchanged except
    that ``dimensions`` (which llama-server ignores) is applied to the vectors."""
    services: Services = request.app.state.services
    raw = await request.body()
    body, name = peek_model(raw)
    try:
        dimensions = validate_embeddings(body)
    except InvalidParam as exc:
        error = openai_error(exc.message, status=400, param=exc.param)
        return Response(orjson.dumps(error), status_code=400, media_type="application/json")
    try:
        model = services.gateway.resolve(name)
    except ModelNotFound as exc:
        raise LlmmanError(f"model '{name}' not found", status=404, code="model_not_found") from exc
    content_type = request.headers.get("content-type", "application/json")
    opening = services.gateway.open(model, "/v1/embeddings", raw, content_type=content_type, embedding=True)
    exchange = await unless_disconnected(request, opening)
    data = await unless_disconnected(request, exchange.read())
    status, data = remap_upstream_error(exchange.status, data)
    if status == 200 and dimensions is not None:
        try:
            data = orjson.dumps(shorten_answer(orjson.loads(data), dimensions))
        except orjson.JSONDecodeError:
            pass  # not JSON: passed on as llama-server sent it
    return Response(data, status_code=status, headers=exchange.headers)
