"""OpenAI routes: ``/v1/chat/completions``, ``/v1/completions`` passed to llama-server byte for
byte (streaming included), and ``/v1/models`` (``/v1/models/{id}``) from the store, each model with the
context it runs with (loaded) or would load with (:func:`model_entry`).

The body is parsed only to be checked (:mod:`llmman.protocol.openai.validate`: the shapes OpenAI
checks, so a malformed ``messages`` or ``tools`` gets OpenAI's 400 naming the ``param`` instead of
llama-server's 500) and for the model's capabilities (Ollama's checks: tools, thinking, vision, chat or
generate, :mod:`llmman.protocol.capabilities`); then the request goes through the pipeline
(api/inference.py) and, served here, the original bytes go upstream and the child's status, headers
and body come back unchanged (api/relay.py :func:`~llmman.api.relay.passthrough`), except a 500 that is
really a bad request, which becomes a 400 (:func:`llmman.protocol.openai.shapes.client_fault`). If the
child dies mid-stream the client gets one SSE ``data: {"error": ...}`` event, as llama-server itself
reports late errors.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial

import orjson
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.cancel import unless_disconnected
from llmman.api.derived import openai_chat_with_defaults
from llmman.api.inference import Call, run
from llmman.api.listing import rendered, stored_listing
from llmman.api.relay import passthrough
from llmman.api.services import Services
from llmman.cluster.peers import HOP
from llmman.errors import LlmmanError, ModelNotFound
from llmman.gateway import ResolvedModel
from llmman.gguf import GGUFInfo
from llmman.protocol.capabilities import capability_error, openai_chat_needs
from llmman.protocol.conversation import conversation_key
from llmman.protocol.errors import Dialect
from llmman.protocol.openai.shapes import models_list, openai_error, peek_model
from llmman.protocol.openai.stream import Kind, stringify_arguments
from llmman.protocol.openai.validate import InvalidParam, validate_chat, validate_completion
from llmman.refs import parse_reference
from llmman.store import StoredModel

log = logging.getLogger("llmman.api.openai")


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    return await _proxy(request, "/v1/chat/completions")


async def completions(request: Request) -> Response:
    """``POST /v1/completions``."""
    return await _proxy(request, "/v1/completions")


def bad_request(message: str, param: str | None = None) -> Response:
    """OpenAI's 400: ``{"error": {"message", "type": "invalid_request_error", "param", "code": null}}``."""
    return Response(orjson.dumps(openai_error(message, status=400, param=param)), status_code=400,
                    media_type="application/json")


async def _proxy(request: Request, path: str) -> Response:
    raw = await request.body()
    body, name = peek_model(raw)
    chat = path == "/v1/chat/completions"
    try:
        if chat:
            validate_chat(body)
        else:
            validate_completion(body)
    except InvalidParam as exc:
        return bad_request(exc.message, exc.param)
    if chat:  # replayed tool calls whose arguments are an object go on as OpenAI's JSON string
        messages, changed = stringify_arguments(body.get("messages"))
        if changed:
            body = {**body, "messages": messages}
            raw = orjson.dumps(body)
    return await run(request, Call(name, partial(_serve, request, path, body, raw, name),
                                   conversation=conversation_key(name, body.get("messages"))))


async def _serve(request: Request, path: str, body: dict[str, object], raw: bytes, name: str,
                 model: ResolvedModel) -> Response:
    """The local step: capabilities, a derived model's defaults, then the bytes to the child."""
    services: Services = request.app.state.services
    chat = path == "/v1/chat/completions"
    needed = openai_chat_needs(body) if chat else ("completion",)
    have = services.store.info(model.stored).capabilities
    refusal = capability_error(name, "chat" if chat else "generate", needed, have)
    if refusal is not None:
        return bad_request(refusal)
    if chat:  # a derived model's system prompt, messages and parameters; else the bytes as they came
        raw = openai_chat_with_defaults(services.store, model.stored, body, raw)
    content_type = request.headers.get("content-type", "application/json")
    # A client that goes away stops the wait (a non-streamed answer arrives only when it is complete).
    opening = services.gateway.open(model, path, raw, content_type=content_type)
    exchange = await unless_disconnected(request, opening)
    options = body.get("stream_options")
    usage = isinstance(options, dict) and options.get("include_usage") is True
    return await passthrough(request, exchange, stream=body.get("stream") is True, dialect=Dialect.OPENAI,
                             requested=name, kind=Kind.CHAT if chat else Kind.COMPLETION, usage_chunk=usage)


def running_contexts(services: Services) -> dict[str, int]:
    """The per-slot context each loaded (or loading) chat child runs with, by reference (its plan's
    ``n_ctx``, as ``/api/ps`` shows it)."""
    return {snap.reference: snap.n_ctx for snap in services.scheduler.snapshot() if not snap.embedding}


def model_entry(services: Services, stored: StoredModel, running: Mapping[str, int]) -> dict[str, object]:
    """One ``/v1/models`` entry (without ``id``): ``context_length`` (= ``max_model_len``, ``meta.n_ctx``) is
    the context the model runs with when loaded, else the one it would load with; ``meta.n_ctx_train`` the
    GGUF's trained context (the most ``num_ctx`` can ask for)."""
    try:
        info: GGUFInfo | None = services.store.info(stored)
    except Exception:
        info = None
    return _entry(services, stored, _trained(info), running)


def _trained(info: GGUFInfo | None) -> int | None:
    """The GGUF's trained context, None when unknown."""
    raw = info.context_length if info is not None else None
    return int(raw) if raw else None


def _entry(services: Services, stored: StoredModel, trained: int | None,
           running: Mapping[str, int]) -> dict[str, object]:
    """:func:`model_entry` for a model whose trained context is known."""
    n_ctx = running.get(stored.reference) or services.gateway.context_for(stored, trained)
    meta: dict[str, object] = {"n_ctx": n_ctx}
    if trained:
        meta["n_ctx_train"] = trained
    return {"created": int(stored.modified_at), "context_length": n_ctx, "meta": meta}


async def models(request: Request) -> Response:
    """``GET /v1/models``: every stored model, with ``context_length`` and ``max_model_len`` (see
    :func:`model_entry`). Rendered once per store listing and set of loaded models whose context is not
    the one they would load with."""
    services: Services = request.app.state.services
    listing = await stored_listing(services, details=True)
    running = running_contexts(services)
    changed = []
    for ref, n_ctx in sorted(running.items()):
        stored = listing.by_name.get(ref.lower())
        if stored is None or stored.reference != ref or n_ctx != services.gateway.context_for(
                stored, _trained(listing.info(stored.digest))):
            changed.append((ref, n_ctx))

    def build() -> bytes:
        entries = [{**_entry(services, stored, _trained(listing.info(stored.digest)), running),
                    "id": stored.reference} for stored in listing.models]
        return orjson.dumps(models_list(entries))

    return Response(rendered(listing, "/v1/models", tuple(changed), build), media_type="application/json")


async def model(request: Request) -> Response:
    """``GET /v1/models/{id}`` (the openai SDK's ``models.retrieve``): one ``/v1/models`` entry. ``id`` is any
    name llmman resolves (it may hold ``/`` and ``:``) and is echoed as sent, as Ollama does. A model this
    node lacks is looked up in its peers' ``/v1/models`` (not for a forwarded request, answered for this
    node only). Raises LlmmanError: 404 ``model '<id>' not found``, code ``model_not_found``, in OpenAI's
    error shape."""
    services: Services = request.app.state.services
    name = str(request.path_params["id"])
    entry: dict[str, object] | None = None
    try:
        stored = services.gateway.resolve(name).stored
    except ModelNotFound:
        if services.peers and HOP not in request.headers:
            entry = _peer_entry(name, services, await services.peers.gather("/v1/models"))
    else:
        entry = model_entry(services, stored, running_contexts(services))
    if entry is None:
        raise ModelNotFound(name)
    item = models_list([{**entry, "id": name}])["data"]
    return Response(orjson.dumps(item[0] if isinstance(item, list) else {}), media_type="application/json")


def _peer_entry(name: str, services: Services,
                answers: Sequence[tuple[object, object]]) -> dict[str, object] | None:
    """The first peer ``/v1/models`` entry whose ``id`` is ``name``'s full reference, or None."""
    try:
        wanted = str(parse_reference(name, services.settings.aliases))
    except LlmmanError:
        return None
    for _, doc in answers:
        data = doc.get("data") if isinstance(doc, dict) else None
        for item in data if isinstance(data, list) else []:
            if isinstance(item, dict) and item.get("id") == wanted:
                return dict(item)
    return None
