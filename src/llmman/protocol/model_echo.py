"""Echoing the client's model name in a passed-through OpenAI-shaped answer. No I/O here.

llama-server names itself by its ``-a`` alias (llmman's canonical reference, e.g.
``docker.io/ai/smollm2:135m``) in every answer's ``"model"`` field; Ollama echoes the string the client
sent (``smollm2:135m``). The relay keeps the child's bytes and only swaps the exact bytes
``"model":"<alias>"`` for ``"model":"<requested>"`` (llama-server writes compact JSON), chunk by chunk:
:func:`rewrite_chunk` holds back at most a tail that could be the start of the pattern (SSE events end in
``\\n\\n``, so normally nothing), :class:`ModelEcho` carries it to the next chunk and flushes it at the end.
The result is exactly ``whole_stream.replace(old, new)`` however the stream is cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

__all__ = ["ModelEcho", "model_field", "rewrite_chunk"]


def model_field(name: str) -> bytes:
    """The compact JSON bytes ``"model":"<name>"``, ``name`` JSON-escaped as orjson (and llama-server) write
    it."""
    return b'"model":' + orjson.dumps(name)


def rewrite_chunk(carry: bytes, chunk: bytes, old: bytes, new: bytes) -> tuple[bytes, bytes]:
    """``(bytes to send now, bytes to carry)`` for ``chunk`` arriving after the held-back ``carry``.

    Every whole ``old`` in ``carry + chunk`` becomes ``new`` (leftmost, not overlapping, as
    ``bytes.replace``); the longest tail after the last match that is a proper prefix of ``old`` is held
    back, since the next chunk may complete it. ``old`` must be non-empty.
    """
    buf = carry + chunk
    parts: list[bytes] = []
    pos = 0
    while (found := buf.find(old, pos)) != -1:
        parts += [buf[pos:found], new]
        pos = found + len(old)
    rest = buf[pos:]
    held = 0
    # The held tail starts with old's first byte within the last len(old) - 1 bytes: only those places
    # are tried, the earliest first (the longest tail), so a chunk ending "}\n\n" costs one find.
    at = rest.find(old[:1], max(0, len(rest) - len(old) + 1))
    while at != -1:
        if old.startswith(rest[at:]):
            held = len(rest) - at
            break
        at = rest.find(old[:1], at + 1)
    parts.append(rest[: len(rest) - held])
    return b"".join(parts), rest[len(rest) - held:]


@dataclass
class ModelEcho:
    """A stream rewriter: :meth:`feed` each chunk, then :meth:`flush` once at the end.

    Attributes:
        old: the child's ``"model":"<alias>"`` bytes (see :func:`model_field`).
        new: the replacement ``"model":"<requested>"`` bytes.
    """

    old: bytes
    new: bytes
    _carry: bytes = b""
    _no_newline: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self._no_newline = b"\n" not in self.old

    @classmethod
    def between(cls, alias: str, requested: str) -> ModelEcho | None:
        """A rewriter from ``alias`` to ``requested``, or None when they are equal (nothing to change)."""
        return None if alias == requested else cls(model_field(alias), model_field(requested))

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` (after any held tail) that can be sent now."""
        if not self._carry and chunk.endswith(b"\n") and self._no_newline:
            # The usual chunk, whole SSE events: a chunk ending in a newline has no tail that could start
            # ``old`` (JSON escapes every newline, so ``old`` holds none), so one C-level replace does it.
            return chunk.replace(self.old, self.new)
        out, self._carry = rewrite_chunk(self._carry, chunk, self.old, self.new)
        return out

    def flush(self) -> bytes:
        """The held tail (never completed into a match): the stream's last bytes."""
        out, self._carry = self._carry, b""
        return out
