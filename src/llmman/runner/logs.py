"""A llama-server child's output: a ring buffer of recent lines plus an append-only per-model log file.

llama-server logs asynchronously through a bounded queue and blocks when its pipe is full
(llama.cpp ``common/log.cpp``), so the owner reads the pipes continuously and hands every chunk
here. Chunks are split into lines per stream; a line without a newline yet (llama.cpp prints progress
dots) stays pending until its newline, EOF, or :data:`MAX_PENDING` bytes.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

MAX_PENDING = 64 * 1024  # bytes of an unterminated line kept before it is flushed as a line
_READ_CHUNK = 64 * 1024


class ChildLog:
    """Recent output lines of one child (at most ``ring_lines``) and its log file at ``path``.

    Not thread-safe; used from the event loop only. Writing after :meth:`close` only updates the ring.
    """

    def __init__(self, path: Path, *, ring_lines: int) -> None:
        self.path = path
        self._ring: collections.deque[str] = collections.deque(maxlen=max(1, ring_lines))
        self._pending: dict[str, bytes] = {}
        self._file: TextIO | None = None
        self.count = 0  # lines added since creation (the ring keeps only the last ones)

    def open(self) -> None:
        """Open the log file for appending, creating its directory (a missing parent must not lose logs)."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8", errors="replace")

    def note(self, text: str) -> None:
        """Write one llmman line (start, exit, stop markers) to the file only, with a UTC timestamp."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._write(f"--- llmman {stamp}: {text}\n")

    async def drain(self, reader: asyncio.StreamReader, stream: str, on_chunk: Callable[[], None]) -> None:
        """Read ``reader`` to EOF into this log as ``stream``, calling ``on_chunk()`` after every chunk."""
        while data := await reader.read(_READ_CHUNK):
            on_chunk()
            self.feed(stream, data)
        self.finish(stream)

    def feed(self, stream: str, data: bytes) -> None:
        """Add a chunk read from ``stream`` ("stdout"/"stderr"); complete lines go to the ring and file."""
        buffered = self._pending.get(stream, b"") + data
        *lines, rest = buffered.split(b"\n")
        if len(rest) > MAX_PENDING:
            lines.append(rest)
            rest = b""
        self._pending[stream] = rest
        for raw in lines:
            self._add(raw)

    def finish(self, stream: str) -> None:
        """``stream`` reached EOF: keep its unterminated last line, if any."""
        rest = self._pending.pop(stream, b"")
        if rest:
            self._add(rest)

    def tail(self, n: int) -> list[str]:
        """The last ``n`` lines (oldest first), without newlines."""
        if n <= 0:
            return []
        return list(self._ring)[-n:]

    @property
    def lines(self) -> list[str]:
        """The whole ring buffer (oldest first)."""
        return list(self._ring)

    def close(self) -> None:
        """Close the log file; idempotent."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _add(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        self._ring.append(line)
        self.count += 1
        self._write(line + "\n")

    def _write(self, text: str) -> None:
        if self._file is not None:
            self._file.write(text)
            self._file.flush()
