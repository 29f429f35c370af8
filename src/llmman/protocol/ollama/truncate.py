"""Fitting an Ollama prompt longer than the model's context, as Ollama does (pure; the child's tokenizer
and template are asked by api/ollama_fit.py).

Ollama's ``truncate`` defaults to true on ``/api/chat`` and ``/api/generate``:

* a chat is cut from the front, message by message, keeping every system message and always the latest
  message (its server's ``chatPrompt``); a tool result is never kept without the assistant turn whose
  tool call it answers (:func:`block_start`);
* a prompt that still does not fit (the latest message alone is too long, or a raw prompt) keeps its end:
  Ollama's runner keeps the first ``num_keep`` tokens and cuts the rest so that the prompt takes
  :func:`prompt_target` tokens, leaving about half the context to the answer. llmman cuts a chat
  message's own text from its front (the template and the system messages stay whole) and a raw prompt's
  tokens as Ollama's runner does (:func:`keep_head_and_tail`).

With ``truncate: false`` an over-long prompt is refused with 400 :data:`REFUSAL`, Ollama's words. The cut
starts only once llama-server has refused the whole prompt (:func:`overflow`), so a prompt that fits is
sent as it is. The fit aims at :func:`prompt_target`, not the whole context: llama-server's slots run
without context shift, so a prompt cut to the very edge would leave the answer no room at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

__all__ = [
    "DEFAULT_NUM_KEEP",
    "MAX_CHARS_PER_TOKEN",
    "REFUSAL",
    "Overflow",
    "block_start",
    "cut_order",
    "first_plausible",
    "keep_head_and_tail",
    "kept",
    "message_text",
    "overflow",
    "pre_cut",
    "prompt_target",
    "starts",
    "with_text",
]

#: Ollama's answer to a prompt longer than the context with ``truncate: false``.
REFUSAL = "the input length exceeds the context length"
#: Ollama's default ``num_keep`` (``api.DefaultOptions``): prompt tokens kept at the start of a cut.
DEFAULT_NUM_KEEP = 4

#: A text with more characters than this per token of the target is taken as too long without asking the
#: child (real tokenizers average 3-5 characters a token): it bounds the chats and texts sent to the child
#: while fitting, so a 10k-message chat or a 1 MB message is not rendered whole a dozen times.
MAX_CHARS_PER_TOKEN = 32

Message = dict[str, object]


@dataclass(frozen=True)
class Overflow:
    """llama-server's refusal of a prompt longer than a slot's context: its count of the prompt's tokens
    and the slot's context size."""

    prompt_tokens: int
    n_ctx: int


def overflow(status: int, body: bytes) -> Overflow | None:
    """The refusal in a llama-server error answer (400 ``exceed_context_size_error`` with
    ``n_prompt_tokens`` and ``n_ctx``); None for any other answer."""
    if status != 400:
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict) or error.get("type") != "exceed_context_size_error":
        return None
    tokens, n_ctx = error.get("n_prompt_tokens"), error.get("n_ctx")
    if not isinstance(tokens, int) or not isinstance(n_ctx, int) or n_ctx < 1:
        return None
    return Overflow(tokens, n_ctx)


def prompt_target(n_ctx: int, num_keep: int) -> int:
    """How many tokens a cut prompt may take in a context of ``n_ctx``: Ollama's runner's limit, which keeps
    ``num_keep`` and frees about half of the rest for the answer (at least one token)."""
    if n_ctx <= 1:
        return 0
    keep = max(0, min(num_keep, n_ctx - 1))
    return n_ctx - max((n_ctx - keep) // 2, 1)


def block_start(messages: Sequence[Message], i: int) -> int:
    """Where a chat kept from message ``i`` must start: at ``i``, unless ``i`` is inside a run of tool
    results, which then starts at the assistant turn holding their tool calls (never an orphaned result)."""
    if i <= 0 or i >= len(messages) or messages[i].get("role") != "tool":
        return i
    start = i
    while start > 0 and messages[start - 1].get("role") == "tool":
        start -= 1
    before = start - 1
    if before >= 0 and messages[before].get("role") == "assistant" and messages[before].get("tool_calls"):
        return before
    return i


def starts(messages: Sequence[Message]) -> list[int]:
    """The places a kept chat may start, oldest first (each distinct :func:`block_start`): Ollama tries
    them in this order and keeps the first that fits; the last always includes the latest message."""
    out: list[int] = []
    for i in range(len(messages)):
        start = block_start(messages, i)
        if not out or start > out[-1]:
            out.append(start)
    return out


def kept(messages: Sequence[Message], start: int) -> list[Message]:
    """The chat kept from ``start``: the system messages before it, then every message from it on."""
    return [m for m in messages[:start] if m.get("role") == "system"] + list(messages[start:])


def first_plausible(messages: Sequence[Message], places: Sequence[int], target: int) -> int:
    """The index into ``places`` (:func:`starts`) of the first start whose kept chat (:func:`kept`) has at
    most ``target`` x :data:`MAX_CHARS_PER_TOKEN` characters of text — the earlier ones cannot fit — or
    the last index when none has. The kept text only shrinks as the start moves on, so the search for the
    first start that fits may begin here."""
    budget = target * MAX_CHARS_PER_TOKEN
    sizes = [len(message_text(m)) for m in messages]
    after = [0] * (len(messages) + 1)  # text from i on
    for i in range(len(messages) - 1, -1, -1):
        after[i] = after[i + 1] + sizes[i]
    system_before, seen = 0, 0
    for index, start in enumerate(places):
        while seen < start:
            if messages[seen].get("role") == "system":
                system_before += sizes[seen]
            seen += 1
        if system_before + after[start] <= budget:
            return index
    return max(len(places) - 1, 0)


def pre_cut(chat: Sequence[Message], target: int) -> list[Message]:
    """``chat`` with every message text longer than ``target`` x :data:`MAX_CHARS_PER_TOKEN` characters cut
    to that many from its end (it would be cut further anyway), before the child counts its tokens."""
    budget = target * MAX_CHARS_PER_TOKEN
    out: list[Message] = []
    for message in chat:
        text = message_text(message)
        out.append(with_text(message, text[-budget:]) if len(text) > budget else message)
    return out


def cut_order(messages: Sequence[Message]) -> list[int]:
    """Which messages of a kept chat lose text, first to last, so that its end stays: the others oldest
    first (the latest message last of them), then the system messages, oldest first."""
    others = [i for i, m in enumerate(messages) if m.get("role") != "system"]
    system = [i for i, m in enumerate(messages) if m.get("role") == "system"]
    return others + system


def message_text(message: Message) -> str:
    """The text of a message's ``content``: the string, or its text parts joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = (p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text")
        return "".join(t for t in texts if isinstance(t, str))
    return ""


def with_text(message: Message, text: str) -> Message:
    """``message`` with its text replaced by ``text`` (parts: the first text part gets it, the other text
    parts go; images stay)."""
    content = message.get("content")
    if not isinstance(content, list):
        return {**message, "content": text}
    parts: list[object] = []
    placed = False
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            if not placed and text:
                parts.append({**part, "text": text})
            placed = True
            continue
        parts.append(part)
    return {**message, "content": parts}


def keep_head_and_tail(tokens: Sequence[int], target: int, head: int) -> list[int]:
    """``tokens`` cut to ``target`` as Ollama's runner cuts a prompt: the first ``head`` tokens (its
    ``num_keep``, plus the BOS the tokenizer added), then the last ones that fit."""
    if len(tokens) <= target:
        return list(tokens)
    head = max(0, min(head, target))
    tail = target - head
    return list(tokens[:head]) + (list(tokens[len(tokens) - tail:]) if tail else [])
