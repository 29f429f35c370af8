"""The few byte-level fixes an OpenAI-shaped answer of llama-server needs before a client sees it.

No I/O here.

The OpenAI-shaped routes relay the child's own bytes (api/relay.py); what llama-server b11434 gets wrong
is fixed here, and only where it is wrong, so the common case costs a few ``bytes.find`` per chunk and no
JSON parse:

- **The first event** (:class:`OpenAIStream`): a chat stream's first chunk carries ``delta.role:
  "assistant"`` and a Responses stream begins with ``response.created``. Under CPU load llama-server
  sometimes leaves that event out; the ``openai`` SDK's Responses helper then refuses the stream and
  strict chat clients lose the role. The missing event is made from the first one that came (its ``id``,
  ``created``, ``model``; a Responses stream's ``response`` object from ``response.in_progress``, else a
  fresh ``resp_`` id), once, before it.
- **One** ``created`` (chat and text completions): every chunk of a stream carries the first chunk's
  ``created``; llama-server stamps each chunk with the second it was made, so a long stream drifts.
- **Usage in its own chunk** (``/v1/completions`` with ``stream_options.include_usage``): llama-server puts
  ``usage`` on the finish chunk; OpenAI sends it in a last chunk of its own with ``choices: []``, the one
  chat streams already have. The finish chunk is split in two.
- **Tool-call arguments as a string** (:func:`fix_arguments`): some builds write ``function.arguments``
  (and a Responses ``function_call``'s ``arguments``) as a JSON object; OpenAI clients expect the
  JSON-encoded string. Found by the bytes ``"arguments":{`` (llama-server writes compact JSON; a space
  after the colon is allowed), then that event alone is parsed and written again.

A stream is handled in whole events (up to the last ``\\n\\n`` seen); a tail that is not a whole event yet
waits for the next chunk (llama-server writes one event per write, so normally nothing waits).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from enum import Enum

import orjson

from llmman.protocol.framing import sse

__all__ = ["Kind", "OpenAIStream", "fix_arguments", "stringify_arguments"]

_END = b"\n\n"
# llama-server writes compact JSON; a space after the colon is allowed for other writers.
_ARGUMENTS = b'"arguments":'
_ARGS_OBJECT = re.compile(rb'"arguments":\s*\{')
_CREATED = b'"created":'
_CREATED_VALUE = re.compile(rb'"created":\s*(\d+)')
_USAGE_KEY = b'"usage":'
_USAGE = re.compile(rb'"usage":\s*\{')
#: A chunk's identity, copied onto a chunk made here.
_IDS = ("id", "created", "model", "system_fingerprint", "object")
#: A tail this long without a whole event in it is sent as it is (not SSE as llama-server writes it).
_MAX_HELD = 1 << 20


class Kind(Enum):
    """Which OpenAI-shaped answer a stream is."""

    CHAT = "chat"  # /v1/chat/completions
    COMPLETION = "completion"  # /v1/completions
    RESPONSES = "responses"  # /v1/responses


def stringify_arguments(value: object) -> tuple[object, bool]:
    """``(value, changed)``: every ``arguments`` member in ``value`` that is a JSON object or array
    becomes its compact JSON string (OpenAI's shape)."""
    if isinstance(value, dict):
        changed = False
        out: dict[str, object] = {}
        for key, item in value.items():
            if key == "arguments" and isinstance(item, dict | list):
                out[key] = orjson.dumps(item).decode()
                changed = True
            else:
                out[key], inner = stringify_arguments(item)
                changed = changed or inner
        return (out, True) if changed else (value, False)
    if isinstance(value, list):
        items = [stringify_arguments(item) for item in value]
        if any(changed for _, changed in items):
            return [item for item, _ in items], True
        return value, False
    return value, False


def fix_arguments(data: bytes) -> bytes:
    """A whole JSON answer with its tool calls' object ``arguments`` as strings; ``data`` itself when it
    has none (or is not JSON)."""
    if not _ARGS_OBJECT.search(data):
        return data
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data
    fixed, changed = stringify_arguments(value)
    return orjson.dumps(fixed) if changed else data


def _data_of(event: bytes) -> bytes | None:
    """The ``data:`` payload of one SSE event (its lines joined), or None for an event without one."""
    lines = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _name_of(event: bytes) -> str | None:
    for line in event.split(b"\n"):
        if line.startswith(b"event:"):
            return line[6:].strip().decode("utf-8", "replace")
    return None


def _json_of(event: bytes) -> dict[str, object] | None:
    data = _data_of(event)
    if data is None:
        return None
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


class OpenAIStream:
    """The fixes above for one streamed answer: :meth:`feed` each chunk, :meth:`flush` once at the end.

    Args:
        kind: which answer this is.
        usage_chunk: a ``/v1/completions`` request asked for ``stream_options.include_usage``.
        new_id: makes a Responses id when the stream lacks both ``response.created`` and
            ``response.in_progress`` (default ``resp_`` + 32 hex digits).
    """

    def __init__(self, kind: Kind, *, usage_chunk: bool = False,
                 new_id: Callable[[], str] | None = None) -> None:
        self.kind = kind
        self.usage_chunk = usage_chunk and kind is Kind.COMPLETION
        self._new_id = new_id or (lambda: "resp_" + uuid.uuid4().hex)
        self._held = b""
        self._started = False
        self._created: bytes | None = None  # the first chunk's created, as its digits
        self._created_field = b""  # ``"created":`` and those digits, made once
        self.synthesised = 0  # first events made here (0 or 1), for tests and the log

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to send now for ``chunk`` (whole events; a partial tail waits)."""
        buf = self._held + chunk if self._held else chunk
        end = buf.rfind(_END)
        if end < 0:
            if len(buf) > _MAX_HELD:
                self._held = b""
                return buf
            self._held = buf
            return b""
        end += len(_END)
        self._held = buf[end:]
        return self._events(buf[:end] if self._held else buf)

    def flush(self) -> bytes:
        """The end of the answer: a held tail, fixed as far as it can be."""
        held, self._held = self._held, b""
        return self._events(held) if held else b""

    def _events(self, whole: bytes) -> bytes:
        if not self._started:
            whole = self._start(whole)
        created, field = self._created, self._created_field
        if created is not None and whole.count(_CREATED) != whole.count(field) and any(
                value != created for value in _CREATED_VALUE.findall(whole)):  # counts first: C speed
            whole = _CREATED_VALUE.sub(self._same_created, whole)
        if (_ARGUMENTS in whole and _ARGS_OBJECT.search(whole)) or (
                self.usage_chunk and _USAGE_KEY in whole and _USAGE.search(whole)):
            whole = b"".join(self._fix_event(event + _END) for event in whole.split(_END) if event)
        return whole

    def _same_created(self, match: re.Match[bytes]) -> bytes:
        return self._created_field if self._created is not None else match.group(0)

    def _start(self, whole: bytes) -> bytes:
        """``whole`` with the dialect's first event put in front when the child left it out."""
        cut = whole.find(_END)
        first = whole[:cut] if cut >= 0 else whole
        if _data_of(first) is None:  # a comment or an empty event: the start is still to come
            return whole
        self._started = True
        obj = _json_of(first)
        if obj is None or "error" in obj:
            return whole  # [DONE] or an error: nothing to start
        created = obj.get("created")
        if self.kind is not Kind.RESPONSES and isinstance(created, int) and not isinstance(created, bool):
            self._created = str(created).encode()
            self._created_field = _CREATED + self._created
        head = self._missing_head(first, obj)
        if head:
            self.synthesised += 1
        return head + whole

    def _missing_head(self, first: bytes, obj: dict[str, object]) -> bytes:
        if self.kind is Kind.CHAT:
            choices = obj.get("choices")
            delta = choices[0].get("delta") if isinstance(choices, list) and choices and isinstance(
                choices[0], dict) else None
            if not isinstance(delta, dict) or delta.get("role") == "assistant":
                return b""
            role: dict[str, object] = {key: obj[key] for key in _IDS if key in obj}
            role["choices"] = [{"index": 0, "finish_reason": None,
                                "delta": {"role": "assistant", "content": None}}]
            return b"data: " + orjson.dumps(role) + _END
        if self.kind is Kind.RESPONSES:
            kind = obj.get("type") if isinstance(obj.get("type"), str) else _name_of(first)
            if kind == "response.created":
                return b""
            response = obj.get("response") if kind == "response.in_progress" else None
            if not isinstance(response, dict):
                response = {"id": self._new_id(), "object": "response", "status": "in_progress"}
            return sse({"type": "response.created", "response": response}, event="response.created")
        return b""

    def _fix_event(self, event: bytes) -> bytes:
        """One whole event with object ``arguments`` as strings, and a text completion's usage moved
        out of its finish chunk into a chunk of its own."""
        if not _ARGS_OBJECT.search(event) and not _USAGE.search(event):
            return event
        obj = _json_of(event)
        if obj is None:
            return event
        fixed, changed = stringify_arguments(obj)
        out = fixed if isinstance(fixed, dict) else obj
        name = _name_of(event)
        if self.usage_chunk and isinstance(out.get("usage"), dict) and out.get("choices"):
            ids = {key: out[key] for key in _IDS if key in out}
            tail = {**ids, "choices": [], "usage": out["usage"]}
            if "timings" in out:
                tail["timings"] = out["timings"]
            finish = {key: value for key, value in out.items() if key not in ("usage", "timings")}
            return b"data: " + orjson.dumps(finish) + _END + b"data: " + orjson.dumps(tail) + _END
        if not changed:
            return event
        return sse(out, event=name) if name else b"data: " + orjson.dumps(out) + _END
