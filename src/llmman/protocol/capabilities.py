"""Ollama's capability checks for ``/api/chat`` and ``/api/generate``, as pure functions.

A request needs capabilities (``completion`` always; ``tools`` when it sends tools; ``thinking`` when
``think`` is true or a level; ``vision`` when it sends images); the model has the ones its GGUF header
shows (:attr:`llmman.gguf.GGUFInfo.capabilities`, "vision" when the store holds a projector). The first
one missing becomes a 400 worded as Ollama words it (``server/routes.go``
ChatHandler/GenerateHandler and ``CheckCapabilities``):

- no ``completion`` (an embedding model): ``"<model>" does not support chat`` / ``... generate``;
- ``think`` on a model without ``thinking``: ``"<model>" does not support thinking`` (``think: false``
  is always accepted);
- ``tools`` on a model without ``tools``: ``<model> does not support tools`` (Ollama's capability check
  puts the name first, unquoted);
- images on a model without ``vision`` (no mmproj): ``<model> does not support vision``.

``<model>`` is the name as the client sent it.

The ``/v1`` routes reach the same checks in Ollama (its OpenAI, Anthropic and Responses layers call the
native chat and generate handlers), so llmman runs them there too, each answered in its dialect's error
shape: :func:`openai_chat_needs` (``/v1/chat/completions``: tools, ``reasoning_effort``/``reasoning.effort``
other than ``none``, ``image_url`` parts), :func:`responses_needs` (``/v1/responses``: function tools,
``input_image`` parts; ``reasoning`` is passed on, not checked: Codex sends it whatever the model, and a
template without thinking ignores it), :func:`anthropic_needs` (``/v1/messages``: tools, image
blocks; a ``thinking`` request to a model without the capability is *relaxed* to no thinking instead, as
Ollama does so that Claude Code works with any model) and ``("completion",)`` for ``/v1/completions``
(kind ``generate``). Embedding routes have no capability check: Ollama embeds with any model, and so does
llmman (a chat model's embedding child pools with ``mean``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

from llmman.errors import BadRequest

__all__ = ["anthropic_needs", "capability_error", "check_capabilities", "openai_chat_needs",
           "required_capabilities", "responses_needs"]


def _has_images(messages: object) -> bool:
    """True when any upstream (OpenAI-shaped) message carries an ``image_url`` part."""
    if not isinstance(messages, list):
        return False
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") == "image_url" for p in content
        ):
            return True
    return False


def required_capabilities(upstream_body: dict[str, object], think: bool | str | None) -> tuple[str, ...]:
    """The capabilities a translated request needs, in the order Ollama checks them.

    Args:
        upstream_body: the llama-server body built by :mod:`llmman.protocol.ollama.request`.
        think: the client's ``think`` value (validated): True or a level asks for thinking.
    """
    needed = ["completion"]
    if upstream_body.get("tools"):
        needed.append("tools")
    if think is True or isinstance(think, str):
        needed.append("thinking")
    if _has_images(upstream_body.get("messages")):
        needed.append("vision")
    return tuple(needed)


def _thinks(effort: object) -> bool:
    """A reasoning effort that asks for thinking: any value but absent or ``none``."""
    return effort is not None and effort != "none"


def _effort(body: dict[str, object]) -> object:
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        return reasoning["effort"]
    return body.get("reasoning_effort")


def openai_chat_needs(body: dict[str, object]) -> tuple[str, ...]:
    """The capabilities a (validated) ``/v1/chat/completions`` body needs, in Ollama's order."""
    needed = ["completion"]
    if isinstance(body.get("tools"), list) and body["tools"]:
        needed.append("tools")
    if _thinks(_effort(body)):
        needed.append("thinking")
    if _has_images(body.get("messages")):
        needed.append("vision")
    return tuple(needed)


def _has_block(items: object, kinds: Collection[str], depth: int = 0) -> bool:
    """True when a message list (or content list) holds a block whose ``type`` is in ``kinds``, looking
    inside block contents (a ``tool_result`` may carry images) up to a few levels."""
    if not isinstance(items, list) or depth > 4:
        return False
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") in kinds:
            return True
        if _has_block(item.get("content"), kinds, depth + 1):
            return True
    return False


def anthropic_needs(body: dict[str, object]) -> tuple[str, ...]:
    """The capabilities a (validated) ``/v1/messages`` body needs (``thinking`` is relaxed, never needed)."""
    needed = ["completion"]
    if isinstance(body.get("tools"), list) and body["tools"]:
        needed.append("tools")
    if _has_block(body.get("messages"), ("image",)):
        needed.append("vision")
    return tuple(needed)


def responses_needs(body: dict[str, object]) -> tuple[str, ...]:
    """The capabilities a (cleaned-up) ``/v1/responses`` body needs (``reasoning`` is never refused)."""
    needed = ["completion"]
    if isinstance(body.get("tools"), list) and body["tools"]:
        needed.append("tools")
    if _has_block(body.get("input"), ("input_image",)):
        needed.append("vision")
    return tuple(needed)


def capability_error(
    model: str, kind: Literal["chat", "generate"], needed: Sequence[str], have: Collection[str]
) -> str | None:
    """Ollama's error text for the first capability in ``needed`` missing from ``have``; None if none is."""
    for capability in needed:
        if capability in have:
            continue
        if capability == "completion":
            return f'"{model}" does not support {kind}'
        if capability == "thinking":
            return f'"{model}" does not support thinking'
        return f"{model} does not support {capability}"
    return None


def check_capabilities(
    model: str, kind: Literal["chat", "generate"], upstream_body: dict[str, object],
    think: bool | str | None, have: Collection[str],
) -> None:
    """Raise the 400 for a request the model cannot serve.

    Raises:
        BadRequest: 400 with :func:`capability_error`'s text.
    """
    message = capability_error(model, kind, required_capabilities(upstream_body, think), have)
    if message is not None:
        raise BadRequest(message)
