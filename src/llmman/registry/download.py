"""Resumable, verified, single-flight blob downloads into the store.

Rules (OCI distribution-spec 1.1 "Pulling blobs", RFC 9110 §14 ranges):

* A blob already in the store with the declared size is not fetched again (it is pinned against gc).
* Bytes go to ``<store>/partial/<hex>.partial`` (outside ``blobs/``: never visible as a blob). The file
  is flocked by its writer, so two pulls (threads or processes) of the same digest download it once: the
  second waits for the lock and then finds the blob present (single-flight per digest).
* A partial left by an interrupted pull is resumed with ``Range: bytes=N-``; a ``200`` answer restarts it.
* Size and sha256 are checked before the file is renamed into ``blobs/sha256/``; a mismatch deletes the
  partial and fails. Transient errors (connection, stall of :data:`STALL_TIMEOUT_S`, 5xx, 429) are retried
  :data:`ATTEMPTS` times with jittered exponential backoff; each retry resumes where the last stopped.
* A full disk (``ENOSPC``/``EDQUOT``) deletes the partial and fails with a clear message (HTTP 507).
* An llmman node is asked to redirect the GET to its blob server (:data:`BLOB_REDIRECT`, sendfile off its
  event loop; docs/transfer.md); the retries of a failed GET go to the node's main port instead.
* The body is moved by ``splice(2)`` over plain HTTP (:mod:`llmman.registry.splice`), else read into
  buffers that two threads write and hash (:mod:`llmman.registry.pipeline`); the pages' write-back to disk
  is started every 16 MiB (:class:`_Writeback`), so the single ``fsync`` at the end has little left.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import http.client
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from llmman.errors import StoreError
from llmman.registry import splice
from llmman.registry.client import BLOB_REDIRECT, RegistryClient, RegistryUnavailable, check
from llmman.registry.pipeline import Pipeline
from llmman.registry.rawget import get_blob
from llmman.store import Store
from llmman.store.layout import digest_hex

log = logging.getLogger("llmman.registry")

ATTEMPTS = 5
BACKOFF_S = 0.5  # first retry delay, doubled each time, ±25%
CHUNK = 4 << 20  # bytes per read when re-hashing a partial file
WRITEBACK_STEP = 16 << 20  # bytes written between two starts of their write-back to disk
SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h
Progress = Callable[[int], None]  # called with the bytes completed so far


class Downloader:
    """Fetches blobs for one store; one instance per daemon so single-flight spans all pulls."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.partial_dir = store.root / "partial"
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock_for(self, digest: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(digest, threading.Lock())

    def fetch(self, client: RegistryClient, repository: str, digest: str, size: int,
              progress: Progress) -> bool:
        """Make blob ``digest`` (``size`` bytes) present in the store; returns False when it was already
        there (nothing downloaded). Raises RegistryError, StoreError (mismatch, disk full)."""
        hexd = digest_hex(digest)
        if self.store.has_blob(digest, size, pin=True):
            progress(size)
            return False
        with self._lock_for(digest):
            if self.store.has_blob(digest, size, pin=True):
                progress(size)
                return False
            self.partial_dir.mkdir(parents=True, exist_ok=True)
            path = self.partial_dir / f"{hexd}.partial"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # another process may be fetching it: wait for it
                if self.store.has_blob(digest, size, pin=True):
                    with contextlib.suppress(FileNotFoundError):
                        if os.fstat(fd).st_ino == os.stat(path).st_ino:
                            os.unlink(path)
                    progress(size)
                    return False
                self._download(client, repository, digest, size, fd, path, progress)
            finally:
                os.close(fd)
            return True

    def _download(self, client: RegistryClient, repository: str, digest: str, size: int, fd: int,
                  path: Path, progress: Progress) -> None:
        h = hashlib.sha256()
        offset = os.fstat(fd).st_size
        if offset > size:
            os.ftruncate(fd, 0)
            offset = 0
        os.lseek(fd, 0, os.SEEK_SET)
        while chunk := os.read(fd, CHUNK) if offset else b"":  # re-hash what an earlier pull left
            h.update(chunk)
        os.lseek(fd, offset, os.SEEK_SET)
        progress(offset)
        state = _Resume(offset, h)
        writeback = _Writeback(fd, offset)

        def written(done: int) -> None:
            progress(done)
            writeback.advance(done)

        try:
            self._attempts(client, repository, digest, size, fd, path, state, written)
        finally:
            writeback.close()
        offset, got = state.offset, f"sha256:{state.h.hexdigest()}"
        if offset != size or got != digest:
            _drop(path)
            raise StoreError(f"blob {digest} failed verification: got {offset} bytes with digest {got}, "
                             f"expected {size} bytes")
        os.fsync(fd)  # what the write-back has not done yet
        self.store.layout.publish_file(path, digest)

    def _attempts(self, client: RegistryClient, repository: str, digest: str, size: int, fd: int,
                  path: Path, state: _Resume, progress: Progress) -> None:
        """GET the rest of the blob, retrying transient failures (each retry resumes at ``state``)."""
        for attempt in range(ATTEMPTS):
            try:
                self._stream(client, repository, digest, size, fd, state, progress, direct=attempt == 0)
                break
            except (RegistryUnavailable, httpx.TransportError) as exc:
                if attempt == ATTEMPTS - 1:
                    raise RegistryUnavailable(f"blob {digest[:19]}: {exc} (after {ATTEMPTS} attempts)"
                                              ) from exc
                delay = BACKOFF_S * 2**attempt * random.uniform(0.75, 1.25)
                log.warning("blob %s: %s; retrying in %.1fs from byte %d", digest[:19], exc, delay,
                            state.offset)
                time.sleep(delay)
            except StoreError:
                _drop(path)
                raise
            except OSError as exc:
                _drop(path)
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise StoreError(f"no space left on device: the store {self.store.root} cannot hold "
                                     f"blob {digest[:19]} ({size} bytes); free some space (`llmman rm`) "
                                     "and pull again", status=507) from exc
                raise

    def _stream(self, client: RegistryClient, repository: str, digest: str, size: int, fd: int,
                state: _Resume, progress: Progress, *, direct: bool = True) -> None:
        """One GET from ``state.offset``, appending to ``fd``. ``state`` holds what the file and the
        hash agree on afterwards, also when the GET failed part-way: the retry resumes from there.
        ``direct``: ask an llmman node for its blob server (:data:`BLOB_REDIRECT`); retries do not,
        so a blob port the client cannot reach (a proxy or a port mapping in between) costs one try."""
        if state.offset == size:
            return
        path = f"/v2/{repository}/blobs/{digest}"
        scope = f"repository:{repository}:pull"
        with client.request("HEAD", path, scope=scope) as response:  # settles auth; 404 = no such blob
            check(response, f"blob {digest[:19]}")
        offset = state.offset
        os.lseek(fd, offset, os.SEEK_SET)
        headers = {**client.auth_headers(scope), **({"Range": f"bytes={offset}-"} if offset else {}),
                   **({BLOB_REDIRECT: "1"} if direct else {})}
        body = _Body(fd, offset, state.h, size, digest, progress, client.stall_timeout)
        try:
            get_blob(client, path, headers, body.open)
        finally:
            body.close()
            state.offset, state.h = body.offset, body.h


class _Resume:
    """Where a download stands across attempts: ``offset`` bytes are in the partial file and in ``h``."""

    def __init__(self, offset: int, h: hashlib._Hash) -> None:
        self.offset, self.h = offset, h


class _Body:
    """One GET's body: spliced into the partial file (plain HTTP, :mod:`llmman.registry.splice`) or
    appended and hashed by a :class:`Pipeline`."""

    def __init__(self, fd: int, offset: int, h: hashlib._Hash, size: int, digest: str,
                 progress: Progress, stall_timeout: float) -> None:
        self.fd, self.offset, self.h, self.size, self.digest = fd, offset, h, size, digest
        self.progress, self.stall_timeout = progress, stall_timeout
        self.pipeline: Pipeline | None = None
        self._pushed = offset

    def open(self, status: int) -> _Body:
        """Before the body: a 200 to a ranged request means the server sends it all, so start over."""
        if self.offset and status != 206:
            os.ftruncate(self.fd, 0)
            os.lseek(self.fd, 0, os.SEEK_SET)
            self.offset, self._pushed, self.h = 0, 0, hashlib.sha256()
        return self

    def splice(self, response: http.client.HTTPResponse, sock: socket.socket | None) -> bool:
        if not splice.usable(response, sock):
            return False
        assert sock is not None
        if self.offset + (response.length or 0) > self.size:
            raise StoreError(f"blob {self.digest} is larger than the declared {self.size} bytes")
        splicer = splice.Splicer(self.fd, self.offset, self.h, self.progress, self.stall_timeout)
        try:
            splicer.run(response, sock)
        finally:
            self.offset = self._pushed = splicer.offset
        return True

    def buffer(self) -> memoryview:
        if self.pipeline is None:
            self.pipeline = Pipeline(self.fd, self.offset, self.h, self.progress)
        return self.pipeline.buffer()

    def push(self, n: int) -> None:
        assert self.pipeline is not None
        if self._pushed + n > self.size:
            raise StoreError(f"blob {self.digest} is larger than the declared {self.size} bytes")
        self._pushed += n
        self.pipeline.push(n)

    def close(self) -> None:
        """Drain the pipeline: afterwards :attr:`offset` bytes are in the file and in :attr:`h`."""
        if self.pipeline is not None:
            pipeline, self.pipeline = self.pipeline, None
            try:
                pipeline.close()
            finally:
                self.offset = pipeline.offset


class _Writeback:
    """Starts the disk writes of a download while it runs (``sync_file_range(2)``,
    ``SYNC_FILE_RANGE_WRITE``, from its own thread, every :data:`WRITEBACK_STEP` bytes), so the one
    ``fsync`` before the rename waits for the last step only instead of the whole blob. Does nothing
    where the call is missing (not Linux)."""

    def __init__(self, fd: int, offset: int) -> None:
        self.fd, self._done, self._target = fd, offset, offset
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        if _sync_file_range is not None:
            self._thread = threading.Thread(target=self._run, name="blob-writeback", daemon=True)
            self._thread.start()

    def advance(self, offset: int) -> None:
        """``offset`` bytes of the file are written (called from the download's threads)."""
        if self._thread is not None and offset - self._done >= WRITEBACK_STEP:
            with self._wake:
                self._target = max(self._target, offset)
                self._wake.notify()

    def close(self) -> None:
        if self._thread is not None:
            with self._wake:
                self._closed = True
                self._wake.notify()
            self._thread.join()

    def _run(self) -> None:
        assert _sync_file_range is not None
        while True:
            with self._wake:
                while not self._closed and self._target - self._done < WRITEBACK_STEP:
                    self._wake.wait()
                if self._closed:
                    return
                start, end = self._done, self._target
                self._done = end
            if _sync_file_range(self.fd, ctypes.c_int64(start), ctypes.c_int64(end - start),
                                SYNC_FILE_RANGE_WRITE) != 0:
                return  # e.g. EINVAL on a file system without it: the final fsync does all the work


def _libc_sync_file_range() -> Callable[..., int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _libc_sync_file_range()


def _drop(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
