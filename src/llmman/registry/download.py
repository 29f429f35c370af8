"""Resumable, verified, single-flight blob downloads into the store.

Rules (OCI distribution-spec 1.1 "Pulling blobs", RFC 9110 §14 ranges; reference/llmman.md 4.2, 10.6):

* A blob already in the store with the declared size is not fetched again (it is pinned against gc).
* Bytes go to ``<store>/partial/<hex>.partial`` (outside ``blobs/``: never visible as a blob). The file
  is flocked by its writer, so two pulls (threads or processes) of the same digest download it once: the
  second waits for the lock and then finds the blob present (single-flight per digest).
* A partial left by an interrupted pull is resumed with ``Range: bytes=N-``; a ``200`` answer restarts it.
* Size and sha256 are checked before the file is renamed into ``blobs/sha256/``; a mismatch deletes the
  partial and fails. Transient errors (connection, stall of :data:`STALL_TIMEOUT_S`, 5xx, 429) are retried
  :data:`ATTEMPTS` times with jittered exponential backoff; each retry resumes where the last stopped.
* A full disk (``ENOSPC``/``EDQUOT``) deletes the partial and fails with a clear message.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from llmman.errors import StoreError
from llmman.registry.client import RegistryClient, RegistryUnavailable, check
from llmman.registry.rawget import get_blob
from llmman.store import Store
from llmman.store.layout import digest_hex

log = logging.getLogger("llmman.registry")

ATTEMPTS = 5
BACKOFF_S = 0.5  # first retry delay, doubled each time, ±25%
CHUNK = 1 << 20
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
        for attempt in range(ATTEMPTS):
            try:
                offset, h = self._stream(client, repository, digest, size, fd, offset, h, progress)
                break
            except (RegistryUnavailable, httpx.TransportError) as exc:
                if attempt == ATTEMPTS - 1:
                    raise RegistryUnavailable(f"blob {digest[:19]}: {exc} (after {ATTEMPTS} attempts)"
                                              ) from exc
                delay = BACKOFF_S * 2**attempt * random.uniform(0.75, 1.25)
                log.warning("blob %s: %s; retrying in %.1fs from byte %d", digest[:19], exc, delay, offset)
                time.sleep(delay)
            except StoreError:
                _drop(path)
                raise
            except OSError as exc:
                _drop(path)
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise StoreError(f"no space left on the device of the store {self.store.root} "
                                     f"while writing blob {digest[:19]} ({size} bytes)") from exc
                raise
        got = f"sha256:{h.hexdigest()}"
        if offset != size or got != digest:
            _drop(path)
            raise StoreError(f"blob {digest} failed verification: got {offset} bytes with digest {got}, "
                             f"expected {size} bytes")
        os.fsync(fd)
        self.store.layout.publish_file(path, digest)

    def _stream(self, client: RegistryClient, repository: str, digest: str, size: int, fd: int,
                offset: int, h: hashlib._Hash, progress: Progress) -> tuple[int, hashlib._Hash]:
        """One GET from ``offset``; appends to ``fd``. Returns the new offset and hash state."""
        if offset == size:
            return offset, h
        path = f"/v2/{repository}/blobs/{digest}"
        scope = f"repository:{repository}:pull"
        with client.request("HEAD", path, scope=scope) as response:  # settles auth; 404 = no such blob
            check(response, f"blob {digest[:19]}")
        headers = {**client.auth_headers(scope), **({"Range": f"bytes={offset}-"} if offset else {})}
        sink = _Sink(fd, offset, h, size, digest, progress)
        get_blob(client, path, headers, sink.status, sink.write)
        return sink.offset, sink.h


class _Sink:
    """Appends a blob's bytes to the partial file, hashing and reporting as they come."""

    def __init__(self, fd: int, offset: int, h: hashlib._Hash, size: int, digest: str,
                 progress: Progress) -> None:
        self.fd, self.offset, self.h, self.size, self.digest = fd, offset, h, size, digest
        self.progress = progress

    def status(self, status: int) -> None:
        """Before the body: a 200 to a ranged request means the server sends it all, so start over."""
        if self.offset and status != 206:
            os.ftruncate(self.fd, 0)
            os.lseek(self.fd, 0, os.SEEK_SET)
            self.offset, self.h = 0, hashlib.sha256()

    def write(self, piece: memoryview) -> None:
        if self.offset + len(piece) > self.size:
            raise StoreError(f"blob {self.digest} is larger than the declared {self.size} bytes")
        _write_all(self.fd, piece)
        self.h.update(piece)
        self.offset += len(piece)
        self.progress(self.offset)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _drop(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
