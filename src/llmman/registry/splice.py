"""The zero-copy path for a blob body over plain HTTP (Linux): ``splice(2)`` socket -> pipe -> file.

The bytes never enter Python: the kernel moves them from the socket into the partial file's pages, and a
hasher thread feeds sha256 straight from those pages (``mmap`` of the ranges just written), so the only
user-space pass over the data is the hash. This takes about a third less CPU per GB than reading into
buffers and writing them out (bench/bench_pull.py), which matters on a node whose cores also run models.

Used only when it is safe: plain HTTP (no TLS), identity encoding with a ``Content-Length``, and
``os.splice`` available; otherwise :mod:`llmman.registry.pipeline` does the work. A read that gets no
byte for the stall timeout raises :class:`RegistryUnavailable` (retried by the caller).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import mmap
import os
import queue
import select
import socket
import threading
from collections.abc import Callable

from llmman.registry.client import RegistryUnavailable

PIPE_SIZE = 1 << 20  # bytes the pipe holds (F_SETPIPE_SZ); one splice moves at most this
HASH_STEP = 8 << 20  # bytes mapped and hashed at a time
_PAGE = mmap.ALLOCATIONGRANULARITY
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # one fault-in per mapping, not per page


def usable(response: http.client.HTTPResponse, sock: socket.socket | None) -> bool:
    """True when ``response``'s body can be spliced from ``sock`` (see module docstring)."""
    if not hasattr(os, "splice") or sock is None or hasattr(sock, "getpeercert"):  # an SSLSocket
        return False
    if response.chunked or response.length is None:
        return False
    return response.getheader("content-encoding", "identity").strip().lower() in ("", "identity")


class _FileHasher:
    """Hashes ranges of ``fd`` in order, in its own thread, from mmap'd page-cache pages."""

    def __init__(self, fd: int, h: hashlib._Hash) -> None:
        self.fd, self.h = fd, h
        self._ranges: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="blob-hasher", daemon=True)
        self._thread.start()

    def add(self, start: int, end: int) -> None:
        self._ranges.put((start, end))

    def close(self) -> None:
        """Hash everything added so far; re-raises a failure of the hasher thread."""
        self._ranges.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _hash(self, start: int, end: int) -> None:
        while start < end:
            stop = min(end, start + HASH_STEP)
            base = start - start % _PAGE
            with mmap.mmap(self.fd, stop - base, flags=_MAP_FLAGS, prot=mmap.PROT_READ, offset=base) as mm:
                view = memoryview(mm)
                try:
                    self.h.update(view[start - base:])
                finally:
                    view.release()
            start = stop

    def _run(self) -> None:
        pending: tuple[int, int] | None = None
        while True:
            item = self._ranges.get()
            if item is not None and pending is not None and pending[1] == item[0] \
                    and item[1] - pending[0] < HASH_STEP:
                pending = (pending[0], item[1])  # coalesce small pieces into one mapping
                continue
            if pending is not None and self._error is None:
                try:
                    self._hash(*pending)
                except BaseException as exc:  # handed to the network thread by close()
                    self._error = exc
            if item is None:
                return
            pending = item


class Splicer:
    """Moves one response's remaining body into ``fd`` (positioned at ``offset``), hashing it into ``h``.
    :attr:`offset` is where the file ends; the file and ``h`` agree on it, also after :meth:`run` raised.
    """

    def __init__(self, fd: int, offset: int, h: hashlib._Hash, progress: Callable[[int], None],
                 stall_timeout: float) -> None:
        self.fd, self.offset, self.h, self.progress = fd, offset, h, progress
        self.stall_timeout = stall_timeout

    def run(self, response: http.client.HTTPResponse, sock: socket.socket) -> None:
        """Raises RegistryUnavailable (connection closed early, or no byte for the stall timeout) or
        OSError (writing the file failed, ``ENOSPC`` included)."""
        hasher = _FileHasher(self.fd, self.h)
        r, w = os.pipe()
        try:
            with contextlib.suppress(OSError):
                fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
            remaining = self._buffered(response, response.length or 0, hasher)
            self._splice(sock.fileno(), r, w, remaining, hasher)
        finally:
            os.close(r)
            os.close(w)
            hasher.close()

    def _advance(self, n: int, hasher: _FileHasher) -> None:
        hasher.add(self.offset, self.offset + n)
        self.offset += n
        self.progress(self.offset)

    def _buffered(self, response: http.client.HTTPResponse, remaining: int, hasher: _FileHasher) -> int:
        """Write the body bytes that arrived with the headers (in http.client's buffer); returns what is
        left to come."""
        if not remaining or response.fp is None:
            return remaining
        try:
            data = response.fp.read(len(response.fp.peek(1)[:remaining]))
        except OSError as exc:
            raise RegistryUnavailable(f"connection failed: {exc or type(exc).__name__}") from exc
        view, written = memoryview(data), 0
        try:
            while written < len(data):
                written += os.write(self.fd, view[written:])
        finally:
            if written:
                self._advance(written, hasher)
        return remaining - len(data)

    def _splice(self, src: int, r: int, w: int, remaining: int, hasher: _FileHasher) -> None:
        poller = select.poll()
        poller.register(src, select.POLLIN)
        flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
        while remaining:
            try:
                n = os.splice(src, w, min(remaining, PIPE_SIZE), flags=flags)
            except BlockingIOError:
                if not poller.poll(self.stall_timeout * 1000):
                    raise RegistryUnavailable(f"no data for {self.stall_timeout:.0f} s") from None
                continue
            except OSError as exc:
                raise RegistryUnavailable(f"connection failed: {exc}") from exc
            if n == 0:
                raise RegistryUnavailable(f"connection closed with {remaining} bytes still to come")
            written = 0
            try:
                while written < n:
                    written += os.splice(r, self.fd, n - written, flags=os.SPLICE_F_MOVE)
            finally:
                if written:
                    self._advance(written, hasher)
            remaining -= n
