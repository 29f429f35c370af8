"""Writing a downloaded blob to its partial file and hashing it, overlapped with the network reads.

The network thread fills buffers from a small pool (:data:`BUFFERS` x :data:`BUFFER` bytes) and hands
each one to two worker threads: one appends it to the file, one feeds it to sha256 (``os.write`` and
``hashlib`` release the GIL for large buffers, so reading, writing and hashing run at once; measured in
bench/bench_pull.py). A buffer returns to the pool once both workers are done with it. Every
:data:`WRITEBACK` bytes the writer asks the kernel to start writing the pages back
(``sync_file_range(SYNC_FILE_RANGE_WRITE)``, Linux), so the single ``fsync`` before the blob is published
finds little left to do.

:meth:`Pipeline.close` drains both workers: afterwards the file holds exactly the bytes hashed, and
:attr:`Pipeline.offset` counts them. A write error (``ENOSPC``) stops the pipeline and is re-raised by
:meth:`Pipeline.push` or :meth:`Pipeline.close`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import queue
import threading
from collections.abc import Callable

BUFFER = 1 << 20  # bytes per network read (larger ones fall out of the CPU caches)
BUFFERS = 8  # buffers in flight per download
WRITEBACK = 64 << 20  # start kernel writeback after this many bytes
_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> Callable[[int, int, int], None]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return lambda fd, offset, length: None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int

    def start_writeback(fd: int, offset: int, length: int) -> None:
        fn(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # advisory: errors surface at fsync

    return start_writeback


start_writeback = _load_sync_file_range()


class Pipeline:
    """Appends buffers to ``fd`` (positioned at ``offset``) and hashes them into ``h``, in two threads.

    Args:
        fd: the partial file, open for writing at ``offset``.
        offset: bytes already in the file (and in ``h``).
        h: the sha256 state of those bytes.
        progress: called from the writer thread with the bytes written so far.
    """

    def __init__(self, fd: int, offset: int, h: hashlib._Hash, progress: Callable[[int], None]) -> None:
        self.fd, self.offset, self.h, self.progress = fd, offset, h, progress
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._buffers = [memoryview(bytearray(BUFFER)) for _ in range(BUFFERS)]
        for i in range(BUFFERS):
            self._free.put(i)
        self._pending = [0] * BUFFERS
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._to_write: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._to_hash: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._flushed = offset
        self._threads = [threading.Thread(target=self._writer, name="blob-writer", daemon=True),
                         threading.Thread(target=self._hasher, name="blob-hasher", daemon=True)]
        for t in self._threads:
            t.start()
        self._current = -1

    def buffer(self) -> memoryview:
        """A free buffer to read into (blocks until one is free). Raises the writer's error, if any."""
        self._raise()
        self._current = self._free.get()
        return self._buffers[self._current]

    def push(self, n: int) -> None:
        """Hand the first ``n`` bytes of the buffer from :meth:`buffer` to the writer and the hasher."""
        self._raise()
        index = self._current
        self._pending[index] = 2
        self._to_write.put((index, n))
        self._to_hash.put((index, n))

    def close(self) -> None:
        """Wait until everything pushed is written and hashed; re-raises a write error."""
        self._to_write.put(None)
        self._to_hash.put(None)
        for t in self._threads:
            t.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _release(self, index: int) -> None:
        with self._lock:
            self._pending[index] -= 1
            done = self._pending[index] == 0
        if done:
            self._free.put(index)

    def _writer(self) -> None:
        while (item := self._to_write.get()) is not None:
            index, n = item
            try:
                if self._error is None:
                    view = self._buffers[index][:n]
                    while view:
                        view = view[os.write(self.fd, view):]
                    self.offset += n
                    if self.offset - self._flushed >= WRITEBACK:
                        start_writeback(self.fd, self._flushed, self.offset - self._flushed)
                        self._flushed = self.offset
                    self.progress(self.offset)
            except BaseException as exc:  # handed to the network thread
                self._error = exc
            finally:
                self._release(index)

    def _hasher(self) -> None:
        while (item := self._to_hash.get()) is not None:
            index, n = item
            if self._error is None:
                self.h.update(self._buffers[index][:n])
            self._release(index)
