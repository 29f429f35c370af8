"""OpenAI Responses dialect (``/v1/responses``, ``/v1/responses/input_tokens``): the clean-ups Codex
needs before the body goes to llama-server's own Responses route (``/v1/responses``).

- ``tools[]`` entries whose ``type`` is not ``"function"`` are dropped (Codex always sends
  ``web_search``/``namespace``/``local_shell`` tools that a local model cannot run, and llama-server's
  converter may reject the whole request for them).
- ``input[]`` items with ``role`` ``developer`` or ``system`` are removed and their text (a string, or
  the ``text`` of every block, concatenated) is appended to top-level ``instructions``, joined with a
  blank line; ``instructions`` is written only when non-empty. Chat templates want one leading system
  prompt, which is what llama-server makes of ``instructions``.
- A replayed ``function_call`` item whose ``arguments`` is a JSON object (written by a child or a client
  that got one) gets it as its JSON string: llama-server refuses the object (``Cannot determine type of
  'item'``).

Everything else passes through unchanged. No I/O here.
"""

from __future__ import annotations

from llmman.errors import BadRequest
from llmman.protocol.openai.shapes import peek_model
from llmman.protocol.openai.stream import stringify_arguments
from llmman.protocol.openai.validate import validate_responses

__all__ = ["clean_request"]

_SYSTEM_ROLES = frozenset({"developer", "system"})


def _item_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def clean_request(raw: bytes) -> tuple[dict[str, object], str]:
    """Parse a Responses request and apply the clean-ups above: returns ``(body, model)``.

    Raises:
        BadRequest: not a JSON object, no ``model`` (:func:`~llmman.protocol.openai.peek_model`'s words),
            ``tools`` or ``input`` of the wrong type, ``instructions`` not a string.
    """
    body, model = peek_model(raw)
    validate_responses(body)  # the input bounds (llmman.protocol.limits)
    out = dict(body)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("tools must be an array")
        kept = [t for t in tools if isinstance(t, dict) and t.get("type") == "function"]
        if kept:
            out["tools"] = kept
        else:
            out.pop("tools", None)
            out.pop("tool_choice", None)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("instructions must be a string")
    texts = [instructions] if instructions else []
    items = body.get("input")
    if isinstance(items, list):
        kept_items: list[object] = []
        for item in items:
            if isinstance(item, dict) and item.get("role") in _SYSTEM_ROLES:
                text = _item_text(item.get("content"))
                if text:
                    texts.append(text)
            else:
                kept_items.append(item)
        replayed, changed = stringify_arguments(kept_items)
        out["input"] = replayed if changed else kept_items
    elif items is not None and not isinstance(items, str):
        raise BadRequest("input must be a string or an array of items")
    if texts:
        out["instructions"] = "\n\n".join(texts)
    return out, model
