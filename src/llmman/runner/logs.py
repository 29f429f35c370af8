"""A llama-server child's output: a ring buffer of recent lines plus a per-model log file, rotated by size.

llama-server logs asynchronously through a bounded queue and blocks when its pipe is full
(llama.cpp ``common/log.cpp``), so the owner reads the pipes continuously and hands every chunk
here. Chunks are split into lines per stream; a line without a newline yet (llama.cpp prints progress
dots) stays pending until its newline, EOF, or :data:`MAX_PENDING` bytes.

Writing the file never stops supervision: a log file system that is full or failing (ENOSPC, EIO) only
loses the lines that cannot be written. The pipes are still drained and the ring still fills, every
later line is tried again (so the file resumes once there is room), and the daemon's log says so once
per child (:data:`logger`), not once per line.

The file is rotated like the daemon's own log (llmman.runner.logfiles): a write that would take it past
``max_bytes`` first moves it to ``<name>.log.1`` (keeping ``backups`` old files) and starts a new one.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from llmman.runner import logfiles

logger = logging.getLogger(__name__)

MAX_PENDING = 64 * 1024  # bytes of an unterminated line kept before it is flushed as a line
_READ_CHUNK = 64 * 1024


class ChildLog:
    """Recent output lines of one child (at most ``ring_lines``) and its log file at ``path``.

    Not thread-safe; used from the event loop only. Writing after :meth:`close` only updates the ring.
    No method raises for a failing log file (see the module docstring); ``dropped`` counts the lines lost.
    """

    def __init__(self, path: Path, *, ring_lines: int, max_bytes: int = logfiles.MAX_BYTES,
                 backups: int = logfiles.BACKUPS) -> None:
        self.path = path
        self.max_bytes = max_bytes  # 0 = never rotated
        self.backups = backups
        self._size = 0  # bytes in the current file
        self._ring: collections.deque[str] = collections.deque(maxlen=max(1, ring_lines))
        self._pending: dict[str, bytes] = {}
        self._file: BinaryIO | None = None
        self.count = 0  # lines added since creation (the ring keeps only the last ones)
        self.dropped = 0  # lines (and llmman notes) that could not be written to the file
        self._warned = False

    def open(self) -> None:
        """Open the log file for appending, creating its directory (a missing parent must not lose logs).
        A file that cannot be opened leaves the ring only (said once in the daemon log)."""
        if self._file is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # Unbuffered: a write that fails loses that text only, never a buffer retried forever.
                self._file = self.path.open("ab", buffering=0)
                self._size = os.fstat(self._file.fileno()).st_size
            except OSError as exc:
                self._failed(exc)

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
            file, self._file = self._file, None
            try:
                file.close()
            except OSError as exc:
                self._failed(exc)

    def _add(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        self._ring.append(line)
        self.count += 1
        self._write(line + "\n")

    def _write(self, text: str) -> None:
        if self._file is not None:
            data = text.encode("utf-8", errors="replace")
            try:
                if self.max_bytes and self._size and self._size + len(data) > self.max_bytes:
                    self._rotate()
                if self._file is not None:
                    self._size += self._file.write(data) or 0
            except OSError as exc:
                self.dropped += 1
                self._failed(exc)

    def _rotate(self) -> None:
        """Start a new file: the current one becomes ``.1`` (llmman.runner.logfiles.rotate).

        Raises:
            OSError: a rename failed (the current file is reopened: its line is lost, the next write tries
                again), or the path cannot be opened again (then only the ring is kept).
        """
        assert self._file is not None
        file, self._file = self._file, None
        file.close()
        try:
            logfiles.rotate(self.path, self.backups)
        finally:
            self._file = self.path.open("ab", buffering=0)
            self._size = os.fstat(self._file.fileno()).st_size

    def _failed(self, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("cannot write the llama-server log %s (%s): its output is still read, but "
                           "what cannot be written is dropped", self.path, exc.strerror or exc)
