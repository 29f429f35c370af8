"""Byte-level framing for the two streaming formats llmman speaks: SSE and NDJSON.

Both decoders take raw network chunks (``bytes``) and only decode *complete* lines as UTF-8, so a
multi-byte character split across two chunks survives (the old llmman decoded each chunk on its
own and produced U+FFFD). No I/O happens here.

SSE follows the WHATWG "event stream" rules: lines end in ``\\n``, ``\\r\\n`` or ``\\r``; a blank line
dispatches the event; ``:`` starts a comment (llama-server's keep-alive pings); several ``data:``
lines are joined with ``\\n``; ``event:`` names the event; ``id:``/``retry:`` are ignored.
NDJSON is Ollama's streaming format: one JSON object per ``\\n``-terminated line, never a blank line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

__all__ = [
    "SSE_DONE",
    "FrameError",
    "NDJSONDecoder",
    "SSEDecoder",
    "SSEEvent",
    "ndjson",
    "parse_data",
    "sse",
]

#: The terminator OpenAI-style streams (and llama-server) send after the last chunk.
SSE_DONE = b"data: [DONE]\n\n"

_EOL = re.compile(rb"\r\n|\r|\n")


class FrameError(ValueError):
    """A complete frame whose payload is not what the format promises (an NDJSON line that is not JSON)."""


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched SSE event: ``event`` is the ``event:`` field (None if absent), ``data`` joined data."""

    event: str | None
    data: str


class _LineSplitter:
    """Cuts a byte stream into complete lines; holds back a trailing partial line (and a lone ``\\r``)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buf += chunk
        lines: list[bytes] = []
        start = 0
        for match in _EOL.finditer(self._buf):
            if match.group() == b"\r" and match.end() == len(self._buf):
                break  # may be the first half of "\r\n": wait for the next chunk
            lines.append(self._buf[start : match.start()])
            start = match.end()
        self._buf = self._buf[start:]
        return lines

    @property
    def pending(self) -> bool:
        """Whether a partial line is held back."""
        return bool(self._buf)

    def close(self) -> list[bytes]:
        rest, self._buf = self._buf, b""
        if rest.endswith(b"\r"):
            rest = rest[:-1]
            return [rest]
        return [rest] if rest else []


class SSEDecoder:
    """Incremental SSE parser: ``feed(bytes) -> list[SSEEvent]``, then ``close()`` at end of stream.

    Comments (``: ping``) and events with no ``data`` field produce nothing. Invalid UTF-8 inside a
    complete line is replaced with U+FFFD rather than raising (the line is already known to be whole).
    """

    def __init__(self) -> None:
        self._lines = _LineSplitter()
        self._event: str | None = None
        self._data: list[str] = []
        self._first = True

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume one network chunk; return the events it completed (possibly none)."""
        if fast := self._whole_data_events(chunk):
            return fast
        out: list[SSEEvent] = []
        for raw in self._lines.feed(chunk):
            self._line(raw, out)
        return out

    def _whole_data_events(self, chunk: bytes) -> list[SSEEvent]:
        """The events of ``chunk`` when it is only whole one-line ``data: ...`` events (what llama-server
        sends, one per read from a GPU) and nothing is pending, decoded without cutting lines; else ``[]``
        and :meth:`feed` takes the general way. The same events as the general way, by the rules above."""
        if self._lines.pending or self._data or self._event is not None or not chunk.endswith(b"\n\n") \
                or b"\r" in chunk:
            return []
        pieces = chunk[:-2].split(b"\n\n")
        for piece in pieces:
            if not piece.startswith(b"data: ") or b"\n" in piece:
                return []
        self._first = False
        return [SSEEvent(None, piece[6:].decode("utf-8", errors="replace")) for piece in pieces]

    def close(self) -> list[SSEEvent]:
        """End of stream: flush an unterminated last line and a last event without its blank line."""
        out: list[SSEEvent] = []
        for raw in self._lines.close():
            self._line(raw, out)
        self._dispatch(out)
        return out

    def _line(self, raw: bytes, out: list[SSEEvent]) -> None:
        line = raw.decode("utf-8", errors="replace")
        if self._first:
            self._first = False
            line = line.removeprefix("\ufeff")
        if not line:
            self._dispatch(out)
            return
        if line.startswith(":"):
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value or None

    def _dispatch(self, out: list[SSEEvent]) -> None:
        if self._data:
            out.append(SSEEvent(event=self._event, data="\n".join(self._data)))
        self._event = None
        self._data = []


def parse_data(event: SSEEvent) -> dict[str, object] | None:
    """The JSON object in an OpenAI-style ``data:`` payload, or None for the ``[DONE]`` terminator.

    Raises:
        FrameError: the payload is not JSON, or not a JSON object.
    """
    if event.data.strip() == "[DONE]":
        return None
    try:
        value = orjson.loads(event.data)
    except orjson.JSONDecodeError as exc:
        raise FrameError(f"invalid JSON in SSE data: {exc}") from None
    if not isinstance(value, dict):
        raise FrameError("SSE data is not a JSON object")
    return value


def sse(obj_or_str: object, event: str | None = None) -> bytes:
    """Encode one SSE event: optional ``event: NAME`` line, ``data:`` line(s), blank line.

    A ``str`` is sent verbatim (one ``data:`` line per text line); anything else is serialised with orjson.
    """
    text = obj_or_str if isinstance(obj_or_str, str) else orjson.dumps(obj_or_str).decode()
    head = f"event: {event}\n" if event is not None else ""
    body = "".join(f"data: {part}\n" for part in text.split("\n"))
    return (head + body + "\n").encode()


def ndjson(obj: object) -> bytes:
    """One NDJSON frame: the compact JSON of ``obj`` followed by exactly one ``\\n`` (Ollama §1.5)."""
    return orjson.dumps(obj) + b"\n"


class NDJSONDecoder:
    """Incremental NDJSON parser: ``feed(bytes) -> list[object]``, then ``close()``.

    Lines may end in ``\\n`` or ``\\r\\n``; whitespace-only lines are skipped (be liberal in what we accept).

    Raises:
        FrameError: a complete line that is not valid JSON.
    """

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[object]:
        """Consume one network chunk; return the decoded objects of the lines it completed."""
        self._buf += chunk
        *complete, self._buf = self._buf.split(b"\n")
        return [obj for line in complete for obj in self._decode(line)]

    def close(self) -> list[object]:
        """End of stream: decode an unterminated last line, if any."""
        rest, self._buf = self._buf, b""
        return self._decode(rest)

    @staticmethod
    def _decode(line: bytes) -> list[object]:
        if not line.strip():
            return []
        try:
            return [orjson.loads(line)]
        except orjson.JSONDecodeError as exc:
            raise FrameError(f"invalid NDJSON line: {exc}") from None
