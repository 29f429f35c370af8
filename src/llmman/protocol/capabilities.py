"""Ollama's capability checks for ``/api/chat`` and ``/api/generate``, as pure functions.

A request needs capabilities (``completion`` always; ``tools`` when it sends tools; ``thinking`` when
``think`` is true or a level; ``vision`` when it sends images); the model has the ones its GGUF header
shows (:attr:`llmman.gguf.GGUFInfo.capabilities`, "vision" when the store holds a projector). The first
one missing becomes a 400 worded as Ollama words it (reference/ollama.md §1.3, §1.4, §1.13;
``server/routes.go`` ChatHandler/GenerateHandler and ``CheckCapabilities``):

- no ``completion`` (an embedding model): ``"<model>" does not support chat`` / ``... generate``;
- ``think`` on a model without ``thinking``: ``"<model>" does not support thinking`` (``think: false``
  is always accepted);
- ``tools`` on a model without ``tools``: ``<model> does not support tools`` (Ollama's capability check
  puts the name first, unquoted);
- images on a model without ``vision`` (no mmproj): ``<model> does not support vision``.

``<model>`` is the name as the client sent it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

from llmman.errors import BadRequest

__all__ = ["capability_error", "check_capabilities", "required_capabilities"]


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
        upstream_body: the llama-server body built by :mod:`llmman.protocol.ollama_request`.
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
