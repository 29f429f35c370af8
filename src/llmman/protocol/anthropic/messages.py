"""Anthropic Messages dialect (``/v1/messages``, ``/v1/messages/count_tokens``) over llama-server's own
``/v1/messages``, fixing only where the native route falls short.

What llmman changes, and why:

- Request: checked as Anthropic checks it (:mod:`llmman.protocol.anthropic.validate`; llama-server takes
  most malformed bodies with a 200 or fails with a 500). ``role: "system"`` messages anywhere in
  ``messages`` are moved, in order, into the top-level ``system`` (joined with ``\\n\\n`` after the client's
  own ``system``); llama-server's chat templates only honour one leading system prompt. Server tools
  (``web_search_20250305``, ``bash_20250124``, ...: a ``type`` other than ``custom``) are dropped, as the
  Responses route drops Codex's non-function tools: a local model cannot run them. ``thinking`` is mapped
  to llama-server's reasoning controls by :func:`apply_thinking`. Everything else (text/image blocks,
  ``tools``, ``tool_choice``, ``tool_use``/``tool_result``, ``stop_sequences``, ``max_tokens``) goes through
  untouched. A request whose ``tool_choice`` forces a tool is translated instead
  (:mod:`llmman.protocol.anthropic.tools`).
- Answer: ``id`` becomes ``msg_<upstream id suffix>`` and ``model`` the name the client sent (llama-server
  reports ``chatcmpl-…`` and its model path); a matched stop sequence gives ``stop_reason:
  "stop_sequence"`` (llama-server says ``end_turn``). Streams get a ``ping`` after ``message_start`` as
  Anthropic sends, content blocks one after the other as Anthropic sends them (llama-server opens the
  text block while the thinking block is still open and closes both at the end: the thinking block is
  closed, with its ``signature_delta``, when the next block starts), late upstream errors become an
  ``error`` event, and a stream cut before ``message_stop`` ends with an ``error`` event instead of
  silently.
- Errors: ``{"type": "error", "error": {"type", "message"}}`` with Anthropic's type names; llama-server's
  500s that are really bad requests (images to a model without a projector, unparsable messages) become
  400s (:func:`llmman.protocol.openai.client_fault`).

No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from llmman.errors import BadRequest
from llmman.protocol.anthropic.validate import is_server_tool, validate_request
from llmman.protocol.framing import SSEEvent, sse
from llmman.protocol.openai.shapes import client_fault

__all__ = ["AnthropicStream", "anthropic_error", "apply_thinking", "error_type", "fix_message",
           "prepare_request", "starts_with_message_start", "upstream_error"]

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


def prepare_request(body: object, *, count_tokens: bool = False) -> tuple[dict[str, object], str]:
    """Validate an Anthropic request body and return ``(upstream body, model name)``.

    ``count_tokens``: the body is for ``/v1/messages/count_tokens`` (no ``max_tokens`` there). The checks
    are :func:`~llmman.protocol.anthropic_validate.validate_request`'s; then system turns move into
    ``system`` and server tools are dropped (with ``tool_choice`` when no tool is left).

    Raises:
        BadRequest: with a ``<field>: <problem>`` message.
    """
    validate_request(body, count_tokens=count_tokens)
    assert isinstance(body, dict)
    model = str(body["model"])
    systems: list[str] = []
    if body.get("system") is not None:
        systems.append(_block_text(body["system"]))
    kept: list[object] = []
    for msg in body["messages"]:
        if msg["role"] == "system":
            systems.append(_block_text(msg["content"]))
        else:
            kept.append(msg)
    if not kept:
        raise BadRequest("messages: at least one user or assistant message is required")
    upstream = dict(body)
    upstream["messages"] = kept
    text = "\n\n".join(s for s in systems if s)
    if text:
        upstream["system"] = text
    else:
        upstream.pop("system", None)
    if isinstance(body.get("tools"), list):
        tools = [t for t in body["tools"] if not is_server_tool(t)]
        if tools:
            upstream["tools"] = tools
        else:
            upstream.pop("tools", None)
            upstream.pop("tool_choice", None)
    return upstream, model


def apply_thinking(body: Mapping[str, object], can_think: bool) -> dict[str, object]:
    """Map a prepared body's ``thinking`` to llama-server's reasoning controls.

    - A model without the ``thinking`` capability: ``thinking`` is dropped (Ollama *relaxes* it to no
      thinking rather than refusing, so that Claude Code works with any model).
    - ``{type: enabled, budget_tokens}``: ``chat_template_kwargs.enable_thinking = true`` (templates that
      think only when asked), and ``thinking`` stays, since llama-server turns ``budget_tokens`` into its
      reasoning budget itself.
    - ``{type: adaptive}`` or ``{type: between_tools}``: ``enable_thinking = true`` without a budget
      (llama-server knows neither).
    - ``{type: disabled}``: ``enable_thinking = false`` (llama-server's own route ignores ``disabled``).
    - Absent: nothing; the template's default applies.

    The client's own ``chat_template_kwargs`` (a llama-server extension) are kept and win.
    """
    out = dict(body)
    thinking = body.get("thinking")
    if not isinstance(thinking, dict):
        return out
    if not can_think:
        out.pop("thinking", None)
        return out
    kind = thinking.get("type")
    own = body.get("chat_template_kwargs")
    kwargs: dict[str, object] = {"enable_thinking": kind != "disabled"}
    if isinstance(own, dict):
        kwargs.update(own)
    out["chat_template_kwargs"] = kwargs
    if kind != "enabled":
        out.pop("thinking", None)
    return out


def message_id(upstream_id: object) -> str:
    """``msg_<suffix>`` from llama-server's ``chatcmpl-<suffix>`` (any other string: ``msg_<it>``)."""
    text = upstream_id if isinstance(upstream_id, str) and upstream_id else "local"
    return "msg_" + text.removeprefix("chatcmpl-").removeprefix("msg_")


def _stop_reason(holder: Mapping[str, object]) -> dict[str, object]:
    """``stop_reason: "stop_sequence"`` where a stop sequence matched: llama-server says ``end_turn`` and
    names the sequence in ``stop_sequence``; Anthropic says ``stop_sequence``."""
    out = dict(holder)
    if out.get("stop_reason") == "end_turn" and isinstance(out.get("stop_sequence"), str):
        out["stop_reason"] = "stop_sequence"
    return out


def fix_message(message: Mapping[str, object], model: str) -> dict[str, object]:
    """A non-streamed answer (or ``message_start``'s ``message``) with Anthropic's ``id``, the client's
    ``model`` and ``stop_reason: "stop_sequence"`` when a stop sequence ended it; everything else (content
    blocks, usage) is llama-server's."""
    out = _stop_reason(message)
    out["id"] = message_id(message.get("id"))
    out["model"] = model
    return out


def upstream_error(status: int, body: bytes) -> tuple[int, dict[str, object]]:
    """Turn a llama-server error answer ``{"error": {"code", "message", "type"}}`` into Anthropic's
    ``(status, body)``. A 500 that is the client's mistake (:func:`~llmman.protocol.openai.client_fault`:
    unsupported image input, unparsable messages) becomes a 400."""
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
    if client_fault(status, message):
        status = 400
    return status, anthropic_error(message, status=status)


def starts_with_message_start(head: bytes) -> bool | None:
    """Whether the child's stream, whose first bytes are ``head``, begins with ``message_start``; None
    while its first event is not whole yet. A byte check (llama-server writes ``event: message_start``
    first), no parse."""
    cut = head.find(b"\n\n")
    if cut < 0:
        return None
    first = head[:cut]
    return b"event: message_start" in first or b'"type":"message_start"' in first


class AnthropicStream:
    """Transducer for llama-server's native Anthropic SSE stream: ``feed(event) -> bytes`` to send, then
    ``close() -> bytes`` at end of stream.

    Every stream begins with ``message_start`` (id, model) and ``{"type": "ping"}``, whatever the child
    sends: under CPU load llama-server b11434 sometimes leaves its ``message_start`` out, and the
    ``anthropic`` SDK then yields no text (strict clients reject the stream). When the first event is
    anything else, llmman's own ``message_start`` goes first (``message_id``, the client's model, and
    ``input_tokens`` when the route has counted them, else 0 as the forced-tool stream sends), once; a
    child's ``message_start`` that comes
    later is dropped, its ``input_tokens`` (and cache figures) then ride on ``message_delta``'s usage,
    which Anthropic's clients read as the final figures. Sends content blocks
    one after the other: when a block starts while another is open, the open one is closed first (a
    thinking block with a ``signature_delta`` if it had none), and the upstream's own late
    ``signature_delta``/``content_block_stop`` for it are dropped; a block still open at
    ``message_delta`` is closed there. Reshapes error payloads; drops malformed events; at ``close()``, an
    unfinished stream gets one ``error`` event.
    """

    def __init__(self, model: str, message_id: str = "msg_local") -> None:
        self.model = model
        self.message_id = message_id
        self.finished = False
        self.failed = False
        self.started = False  # message_start (the child's or ours) has been sent
        self.synthesised = False  # ours: the child's first event was not message_start
        self._late_usage: dict[str, object] = {}  # a late child message_start's input figures
        self.input_tokens: int | None = None  # counted by the route when the child's start is missing
        self._open: int | None = None  # the index of the block now open
        self._open_type = ""
        self._signed = False  # the open (thinking) block has had its signature_delta
        self._closed: set[int] = set()

    def _close_open(self) -> bytes:
        if self._open is None:
            return b""
        index, out = self._open, b""
        if self._open_type == "thinking" and not self._signed:
            out += sse({"type": "content_block_delta", "index": index,
                        "delta": {"type": "signature_delta", "signature": ""}}, event="content_block_delta")
        self._open = None
        self._closed.add(index)
        return out + sse({"type": "content_block_stop", "index": index}, event="content_block_stop")

    def _block_event(self, kind: str, data: dict[str, object]) -> bytes:
        index = data.get("index")
        if not isinstance(index, int):
            return sse(data, event=kind)
        if kind == "content_block_start":
            out = self._close_open() if self._open != index else b""
            block = data.get("content_block")
            self._open, self._signed = index, False
            self._open_type = str(block.get("type")) if isinstance(block, dict) else ""
            return out + sse(data, event=kind)
        if kind == "content_block_stop":
            if index in self._closed:
                return b""
            if index == self._open:
                return self._close_open()
            return sse(data, event=kind)
        delta = data.get("delta")
        signature = isinstance(delta, dict) and delta.get("type") == "signature_delta"
        if index in self._closed and signature:
            return b""  # this block was closed with its signature already
        if index == self._open and signature:
            self._signed = True
        return sse(data, event=kind)

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
            if self.started:  # late: ours went first; its input figures go on message_delta
                usage = data["message"].get("usage")
                if isinstance(usage, dict):
                    self._late_usage = {k: v for k, v in usage.items() if k != "output_tokens"}
                return b""
            self.started = True
            data = dict(data)
            data["message"] = fix_message(data["message"], self.model)
            return sse(data, event=kind) + sse({"type": "ping"}, event="ping")
        head = b"" if self.started else self._start()
        return head + self._event(kind, data)

    def _start(self) -> bytes:
        """Our ``message_start`` and ``ping``, for a stream whose child sent none first."""
        self.started = self.synthesised = True
        message: dict[str, object] = {
            "id": self.message_id, "type": "message", "role": "assistant", "content": [],
            "model": self.model, "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens or 0, "output_tokens": 0}}
        return sse({"type": "message_start", "message": message}, event="message_start") + sse(
            {"type": "ping"}, event="ping")

    def _event(self, kind: str, data: dict[str, object]) -> bytes:
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            return self._block_event(kind, data)
        out = self._close_open() if kind in ("message_delta", "message_stop") else b""
        delta = data.get("delta")
        if kind == "message_delta" and isinstance(delta, dict):
            data = {**data, "delta": _stop_reason(delta)}
        if kind == "message_delta" and self._late_usage:
            usage = data.get("usage")
            data = {**data, "usage": {**self._late_usage, **(usage if isinstance(usage, dict) else {})}}
        if kind == "message_stop":
            self.finished = True
        return out + sse(data, event=kind)

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
