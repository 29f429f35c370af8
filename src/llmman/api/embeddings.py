"""Embedding routes: ``POST /api/embed``, ``/api/embeddings`` (Ollama) and ``/v1/embeddings`` (OpenAI,
passed byte for byte unless an input is too long). All run on the model's embedding child
(``--embeddings``, ModelPlan.embedding), started beside any chat child of the same model; each goes through
the pipeline (api/inference.py) like every inference route. Translation:
:mod:`llmman.protocol.ollama.embeddings`.
"""

from __future__ import annotations

import time
from functools import partial

import orjson
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.cancel import unless_disconnected
from llmman.api.inference import Call, run
from llmman.api.services import Services
from llmman.durations import parse_duration
from llmman.errors import LlmmanError, UpstreamError
from llmman.gateway import ResolvedModel, UpstreamExchange
from llmman.protocol.errors import upstream_text
from llmman.protocol.ollama.embeddings import (
    EmbedRequest,
    embed_request,
    fit_tokens,
    legacy_request,
    ollama_embed_response,
    shorten_answer,
    too_long,
    vectors,
)
from llmman.protocol.ollama.fields import parse_json_body
from llmman.protocol.openai.shapes import openai_error, peek_model, remap_upstream_error
from llmman.protocol.openai.validate import InvalidParam, validate_embeddings

JSON = "application/json; charset=utf-8"


async def _post(request: Request, model: ResolvedModel, path: str, body: bytes, *, keep_alive: float | None,
                num_ctx: int | None, content_type: str = "application/json",
                ) -> tuple[int, bytes, UpstreamExchange]:
    """POST ``body`` to the embedding child: ``(status, answer bytes, exchange)`` (already read)."""
    services: Services = request.app.state.services
    opening = services.gateway.open(model, path, body, keep_alive=keep_alive, num_ctx=num_ctx,
                                    content_type=content_type, embedding=True)
    exchange = await unless_disconnected(request, opening)
    data = await unless_disconnected(request, exchange.read())
    return exchange.status, data, exchange


async def _fitted(request: Request, model: ResolvedModel, inputs: list[object], *, truncate: bool,
                  keep_alive: float | None, num_ctx: int | None) -> list[object]:
    """``inputs`` (strings or token arrays) as token arrays cut to the child's per-slot context, tokenized by
    the child itself (``/tokenize`` with its special tokens, as llama-server tokenizes embedding input).

    Raises:
        BadRequest: ``the input length exceeds the context length`` (``truncate`` false).
        LlmmanError: the child would not tokenize.
    """
    services: Services = request.app.state.services
    lease = await services.gateway.acquire(model, keep_alive=keep_alive, num_ctx=num_ctx, embedding=True)
    try:
        props = await services.gateway.get_json(lease, "/props")
    finally:
        lease.release()
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if not isinstance(n_ctx, int) or n_ctx < 1:
        raise LlmmanError("llama-server did not report its context size")
    tokenized: list[list[int]] = []
    for item in inputs:
        if isinstance(item, list):
            tokenized.append([int(t) for t in item if isinstance(t, int)])
            continue
        body = orjson.dumps({"content": item, "add_special": True, "parse_special": True})
        status, data, _ = await _post(request, model, "/tokenize", body, keep_alive=keep_alive,
                                      num_ctx=num_ctx)
        answer = orjson.loads(data) if status == 200 else None
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise LlmmanError(f"llama-server would not tokenize an input: {data[:200]!r}")
        tokenized.append([int(t) for t in tokens])
    return list(fit_tokens(tokenized, n_ctx, truncate=truncate))


async def _embed(request: Request, req: EmbedRequest, model: ResolvedModel
                 ) -> tuple[list[list[float]], int, int]:
    """Run ``req`` on ``model``'s embedding child: ``(vectors, prompt tokens, load ns)``. Over-long inputs
    are cut or refused as :mod:`llmman.protocol.ollama.embeddings` describes."""
    services: Services = request.app.state.services
    keep_alive = None if req.keep_alive is None else parse_duration(req.keep_alive)
    if not req.inputs:
        lease = await services.gateway.acquire(model, keep_alive=keep_alive, num_ctx=req.num_ctx,
                                               embedding=True)
        lease.release()
        return [], 0, int(lease.load_duration * 1e9)
    upstream = req.upstream()
    status, data, exchange = await _post(request, model, "/v1/embeddings", orjson.dumps(upstream),
                                         keep_alive=keep_alive, num_ctx=req.num_ctx)
    load_ns = int(exchange.lease.load_duration * 1e9)
    if status != 200 and too_long(status, upstream_text(data)):
        inputs = await _fitted(request, model, list(req.inputs), truncate=req.truncate, keep_alive=keep_alive,
                               num_ctx=req.num_ctx)
        cut = orjson.dumps({**upstream, "input": inputs})
        status, data, _ = await _post(request, model, "/v1/embeddings", cut, keep_alive=keep_alive,
                                      num_ctx=req.num_ctx)
    if status != 200:
        message = upstream_text(data)
        raise UpstreamError(message, 400 if status >= 500 and "too large" in message else status)
    try:
        answer = orjson.loads(data)
    except orjson.JSONDecodeError:
        answer = None
    embeddings, tokens = vectors(answer, req.dimensions)
    return embeddings, tokens, load_ns


async def embed(request: Request) -> Response:
    """``POST /api/embed``."""
    started = time.monotonic_ns()
    req = embed_request(parse_json_body(await request.body()))

    async def serve(model: ResolvedModel) -> Response:
        embeddings, tokens, load_ns = await _embed(request, req, model)
        body = ollama_embed_response(req.model, embeddings, prompt_tokens=tokens,
                                     total_ns=time.monotonic_ns() - started, load_ns=load_ns)
        return Response(orjson.dumps(body), media_type=JSON)

    return await run(request, Call(req.model, serve))


async def embeddings_legacy(request: Request) -> Response:
    """``POST /api/embeddings``: ``{"embedding": [...]}``."""
    req = legacy_request(parse_json_body(await request.body()))

    async def serve(model: ResolvedModel) -> Response:
        vecs, _, _ = await _embed(request, req, model)
        return Response(orjson.dumps({"embedding": vecs[0] if vecs else []}), media_type=JSON)

    return await run(request, Call(req.model, serve))


async def v1_embeddings(request: Request) -> Response:
    """``POST /v1/embeddings``: the original bytes to the embedding child, its answer unchanged except
    that ``dimensions`` (which llama-server ignores) is applied to the vectors."""
    raw = await request.body()
    body, name = peek_model(raw)
    try:
        dimensions = validate_embeddings(body)
    except InvalidParam as exc:
        error = openai_error(exc.message, status=400, param=exc.param)
        return Response(orjson.dumps(error), status_code=400, media_type="application/json")
    return await run(request, Call(name, partial(_v1_serve, request, body, raw, dimensions)))


async def _v1_serve(request: Request, body: dict[str, object], raw: bytes, dimensions: int | None,
                    model: ResolvedModel) -> Response:
    """The local step of ``/v1/embeddings``: the bytes to the embedding child, cut when too long."""
    content_type = request.headers.get("content-type", "application/json")
    status, data, exchange = await _post(request, model, "/v1/embeddings", raw, keep_alive=None, num_ctx=None,
                                         content_type=content_type)
    inputs = body.get("input")
    if status != 200 and too_long(status, upstream_text(data)) and isinstance(inputs, (str, list)):
        # Ollama's OpenAI route truncates too (its truncate defaults to true); a bare token array is one input
        items = [inputs] if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)) else inputs
        fitted = await _fitted(request, model, list(items), truncate=True, keep_alive=None, num_ctx=None)
        cut = orjson.dumps({**body, "input": fitted})
        status, data, exchange = await _post(request, model, "/v1/embeddings", cut, keep_alive=None,
                                             num_ctx=None)
    status, data = remap_upstream_error(status, data)
    if status == 200 and dimensions is not None:
        try:
            data = orjson.dumps(shorten_answer(orjson.loads(data), dimensions))
        except orjson.JSONDecodeError:
            pass  # not JSON: passed on as llama-server sent it
    return Response(data, status_code=status, headers=exchange.headers)
