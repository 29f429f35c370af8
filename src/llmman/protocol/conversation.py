"""A conversation's key, for affinity: the next turn of a chat goes to the node that served the last.

A client of a chat API sends the whole conversation every turn, so the turns of one conversation share
their beginning. The key is a SHA-256 over the model name, the system prompt (the dialect's own field —
Anthropic's ``system``, Responses' ``instructions`` — then the leading ``system``/``developer``
messages) and the first user message, serialised canonically (JSON, keys sorted). It is the same from
the first turn on, whatever the dialect's message shape (content as a string or as parts), and two
conversations that open alike share a key — harmless, they share a prompt prefix too. The key never
leaves the node (docs/aggregation.md#spreading-and-replicas).
"""

from __future__ import annotations

import hashlib

import orjson

SYSTEM_ROLES = frozenset({"system", "developer"})


def conversation_key(model: str, messages: object, system: object = None) -> str | None:
    """The conversation key of a chat request, or None when it has no user message to key on.

    Args:
        model: the model name as the client sent it.
        messages: the turns: Ollama's and OpenAI's ``messages``, Anthropic's ``messages``, Responses'
            ``input`` (a string is one user message).
        system: the dialect's separate system prompt, if any.
    """
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not isinstance(messages, list):
        return None
    prompts: list[object] = [] if system is None or system == "" else [system]
    first: object = None
    leading = True
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if leading and isinstance(role, str) and role in SYSTEM_ROLES:  # a list role is unhashable
            assert isinstance(message, dict)
            prompts.append(message.get("content"))
            continue
        leading = False
        if role == "user":
            assert isinstance(message, dict)
            first = message.get("content")
            break
    if first is None:
        return None
    try:
        canonical = orjson.dumps([model, prompts, first], option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits, say; no key rather than a failure
        return None
    return hashlib.sha256(canonical).hexdigest()
