"""Derived models at request time: the stored system prompt, parameters and messages of a model
(:mod:`llmman.store.derive`) applied to Ollama and OpenAI chat requests (rules in
:mod:`llmman.protocol.model_defaults`).

A model without such layers costs one look at its manifest's layer list and nothing else: its request
is used exactly as it came (on ``/v1/chat/completions`` the original bytes go upstream).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from llmman.protocol.model_defaults import (
    ModelDefaults,
    apply_chat,
    apply_generate,
    apply_openai_chat,
    generate_messages,
)
from llmman.protocol.ollama.request import UpstreamRequest, chat_request, generate_request
from llmman.store import read_extras

if TYPE_CHECKING:
    from llmman.store import Store, StoredModel

__all__ = ["model_defaults", "ollama_with_defaults", "openai_chat_with_defaults"]


def model_defaults(store: Store, model: StoredModel) -> ModelDefaults:
    """The request defaults stored with ``model`` (empty for a plain model). Raises StoreError when a
    layer blob is missing or malformed."""
    extras = read_extras(store.layout, model)
    return ModelDefaults(system=extras.system, parameters=extras.parameters, messages=extras.messages)


def ollama_with_defaults(store: Store, model: StoredModel, body: dict[str, object],
                         upstream: UpstreamRequest) -> UpstreamRequest:
    """``upstream`` (already built from ``body``, so a bad body was refused before any model lookup or
    pull) rebuilt with ``model``'s defaults when it has any, else returned unchanged.

    Raises BadRequest as the builders (a stored parameter of the wrong type), StoreError for a missing
    layer blob."""
    defaults = model_defaults(store, model)
    if defaults.empty:
        return upstream
    if upstream.kind == "chat":
        return chat_request(apply_chat(body, defaults))
    rebuilt = generate_request(apply_generate(body, defaults))
    messages = rebuilt.body.get("messages")
    if defaults.messages and isinstance(messages, list) and not rebuilt.is_load:
        rebuilt.body["messages"] = generate_messages(messages, defaults)
    return rebuilt


def openai_chat_with_defaults(store: Store, model: StoredModel, body: dict[str, object], raw: bytes) -> bytes:
    """The ``/v1/chat/completions`` body to send upstream: ``raw`` itself for a plain model, else ``body``
    with the model's defaults applied, re-serialized. Raises BadRequest for a stored parameter of the
    wrong type, StoreError for a missing layer blob."""
    defaults = model_defaults(store, model)
    if defaults.empty:
        return raw
    return orjson.dumps(apply_openai_chat(body, defaults))
