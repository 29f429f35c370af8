"""Anthropic Messages dialect (``/v1/messages``, ``/v1/messages/count_tokens``) over llama-server's own
``/v1/messages`` (reference/llama-server.md §3.9), fixing only where the native route falls short.

What llmman changes, and why (reference/llmman.md §2.9 lists what the old llmman got wrong):

- Request: ``role: "system"`` messages anywhere in ``messages`` are moved, in order, into the top-level
  ``system`` (joined with ``\\n\\n`` after the client's own ``system``); llama-server's chat templates only
  honour one leading system prompt. Everything else (text/image blocks, ``tools``, ``tool_choice``,
  ``tool_use``/``tool_result``, ``thinking``, ``stop_sequences``, ``max_tokens``) goes through untouched.
- Answer: ``id`` becomes ``msg_<upstream id suffix>`` and ``model`` the name the client sent (llama-server
  reports ``chatcmpl-…`` and its model path). Streams get a ``ping`` after ``message_start`` as Anthropic
  sends, late upstream errors become an ``error`` event, and a stream cut before ``message_stop`` ends with
  an ``error`` event instead of silently.
- Errors: ``{"type": "error", "error": {"type", "message"}}`` with Anthropic's type names; llama-server's
  500 for images sent to a model without a projector becomes a 400 (it is the client's request).

No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from llmman.errors import BadRequest
from llmman.protocol.framing import SSEEvent, sse

__all__ = ["AnthropicStream", "anthropic_error", "error_type", "fix_message", "prepare_request",
           "upstream_error"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status (other 4xx: invalid_request_error, 5xx: api_error)."""
    if status in _TYPES:
        return _TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_error(message: str, *, status: int) -> dict[str, object]:
    """``{"type": "error", "error": {"type": <error_type(status)>, "message": message}}``."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def _block_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content
                       if isinstance(b, dict) and b.get("type") == "text")
    raise BadRequest("system: content must be a string or an array of text blocks")


def prepare_request(body: object) -> tuple[dict[str, object], str]:
    """Validate an Anthropic request body and return ``(upstream body, model name)``.

    Checked here (so the client gets Anthropic's 400, not llama-server's words): the body is an object,
    ``model`` a non-empty string, ``messages`` an array of objects with a string ``role`` and string or
    array ``content``, ``max_tokens`` (optional, llama-server's default applies) a positive integer,
    ``system`` a string or array of blocks, ``stream`` a boolean.

    Raises:
        BadRequest: with a ``<field>: <problem>`` message.
    """
    if not isinstance(body, dict):
        raise BadRequest("The request body is not a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: Field required")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("messages: Field required (an array of messages)")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or not 0 < max_tokens < 2**31):
        raise BadRequest("max_tokens: must be a positive integer")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("stream: must be a boolean")
    systems: list[str] = []
    if body.get("system") is not None:
        systems.append(_block_text(body["system"]))
    kept: list[object] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages.{i}: must be an object with a string role")
        if not isinstance(msg.get("content"), (str, list)):
            raise BadRequest(f"messages.{i}.content: must be a string or an array of content blocks")
        if msg["role"] == "system":
            systems.append(_block_text(msg["content"]))
        else:
            kept.append(msg)
    upstream = dict(body)
    upstream["messages"] = kept
    text = "\n\n".join(s for s in systems if s)
    if text:
        upstream["system"] = text
    else:
        upstream.pop("system", None)
    return upstream, model


def message_id(upstream_id: object) -> str:
    """``msg_<suffix>`` from llama-server's ``chatcmpl-<suffix>`` (any other string: ``msg_<it>``)."""
    text = upstream_id if isinstance(upstream_id, str) and upstream_id else "local"
    return "msg_" + text.removeprefix("chatcmpl-").removeprefix("msg_")


def fix_message(message: Mapping[str, object], model: str) -> dict[str, object]:
    """A non-streamed answer (or ``message_start``'s ``message``) with Anthropic's ``id`` and the
    client's ``model``; everything else (content blocks, stop_reason, usage) is llama-server's."""
    out = dict(message)
    out["id"] = message_id(message.get("id"))
    out["model"] = model
    return out


def upstream_error(status: int, body: bytes) -> tuple[int, dict[str, object]]:
    """Turn a llama-server error answer ``{"error": {"code", "message", "type"}}`` into Anthropic's
    ``(status, body)``. A 500 about unsupported image input is the client's mistake: 400."""
    message = body.decode("utf-8", "replace").strip() or f"llama-server answered {status}"
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        err = parsed.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            message = err["message"]
        elif isinstance(err, str):
            message = err
    if status >= 500 and "image input is not supported" in message:
        status = 400
    return status, anthropic_error(message, status=status)


class AnthropicStream:
    """Transducer for llama-server's native Anthropic SSE stream: ``feed(event) -> bytes`` to send, then
    ``close() -> bytes`` at end of stream.

    Rewrites ``message_start`` (id, model) and follows it with ``{"type": "ping"}``; reshapes error
    payloads; drops malformed events; at ``close()``, an unfinished stream gets one ``error`` event.
    """

    def __init__(self, model: str) -> None:
        self.model = model
        self.finished = False
        self.failed = False

    def feed(self, event: SSEEvent) -> bytes:
        """Encoded SSE bytes for one upstream event (``b""`` for nothing to send)."""
        try:
            data = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(data, dict):
            return b""
        kind = data.get("type") if isinstance(data.get("type"), str) else event.event
        if kind == "error" or (kind is None and "error" in data):
            return self.error(_error_message(data.get("error")))
        if not isinstance(kind, str):
            return b""
        if kind == "message_start" and isinstance(data.get("message"), dict):
            data = dict(data)
            data["message"] = fix_message(data["message"], self.model)
            return sse(data, event=kind) + sse({"type": "ping"}, event="ping")
        if kind == "message_stop":
            self.finished = True
        return sse(data, event=kind)

    def error(self, message: str, status: int = 500) -> bytes:
        """An in-band ``error`` event (the stream is over after it)."""
        self.failed = True
        return sse(anthropic_error(message, status=status), event="error")

    def close(self) -> bytes:
        """End of the upstream stream: an ``error`` event if it ended before ``message_stop``."""
        if self.finished or self.failed:
            return b""
        return self.error("the model's answer ended before message_stop")


def _error_message(err: object) -> str:
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    return err if isinstance(err, str) else "llama-server reported an error"
