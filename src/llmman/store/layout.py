"""The on-disk OCI image layout: blobs, ``index.json``, the store lock and atomic writes.

OCI image-spec 1.1 ``image-layout.md``: a root with ``oci-layout`` (``{"imageLayoutVersion": "1.0.0"}``),
``index.json`` (an image index) and ``blobs/<alg>/<hex>``. llmman's rules on top (so no two writers
race): ONE lock, ``fcntl.flock`` on ``index.json.lock``, taken around every read-modify-write of
``index.json`` by every thread and process; every file is written to a temp name, fsynced and renamed into
place; a blob appears under its digest only after its sha256 and size were verified.

Temp files (``*.tmp``) are flocked by their writer while being written, so garbage collection can tell a
live write from debris left by a crash.

Verification (docs/store.md): a blob's bytes were hashed when it was written; ``verified/<hex>`` records
the file's size, mtime, ctime, inode and device at that moment. A blob is *verified* while its stat still
matches the record; anything that rewrites it in place (a flipped byte, a truncation, a copy) changes
mtime or ctime, so the record no longer matches and :meth:`Layout.verify_blob` hashes it again. A blob
whose bytes do not match its digest is removed: under its name it can only be wrong.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal

from llmman.errors import StoreError
from llmman.store import mediatypes as mt

log = logging.getLogger(__name__)
CHUNK = 1 << 20  # bytes per read when streaming blobs
STALE_TEMP_S = 60.0  # an unlocked temp file older than this is debris
PIN_TTL_S = 24 * 3600.0  # a written-but-unreferenced blob is protected from gc this long
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_HEX = re.compile(r"[0-9a-f]{64}")
Check = Literal["ok", "corrupt", "missing"]  # what :meth:`Layout.verify_blob` found


def empty_index() -> dict[str, Any]:
    """An OCI image index with no manifests."""
    return {"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": []}


def digest_hex(digest: str) -> str:
    """The hex part of ``sha256:<64 hex>``. Raises StoreError for any other form."""
    m = _DIGEST.fullmatch(digest)
    if m is None:
        raise StoreError(f"unsupported digest {digest!r} (expected sha256:<64 hex>)")
    return m.group(1)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a flocked temp file in the same folder, fsync, rename, fsync dir."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    _fsync_dir(path.parent)


def _chunks(stream: BinaryIO | Iterable[bytes]) -> Iterator[bytes]:
    if isinstance(stream, (bytes, bytearray, memoryview)):
        yield bytes(stream)
        return
    read = getattr(stream, "read", None)
    if read is None:
        yield from stream
        return
    while chunk := read(CHUNK):
        yield chunk


class Layout:
    """One OCI image layout at ``root``; created lazily by the first write. Thread- and process-safe."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blobs = self.root / "blobs" / "sha256"
        self.index_path = self.root / "index.json"
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._lock_fd: int | None = None
        self._pins: dict[str, float] = {}
        self._pins_lock = threading.Lock()
        self._writers_fd: int | None = None
        self.verified_dir = self.root / "verified"
        self._verify_locks: dict[str, threading.Lock] = {}
        self.generation = 0  # writes by this process that can change a listing (llmman.store.listing)

    def changed(self) -> None:
        """Count a write that can change what the store lists (the index, a blob added or removed), so
        this process's kept listing is read again even where file times do not move."""
        self.generation += 1

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the store lock (re-entrant in one thread): a thread lock plus flock on ``index.json.lock``."""
        with self._thread_lock:
            if self._depth == 0:
                self.root.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.root / "index.json.lock", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                self._lock_fd = fd
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._lock_fd is not None:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                    os.close(self._lock_fd)
                    self._lock_fd = None

    def ensure(self) -> None:
        """Create ``oci-layout`` and ``blobs/sha256/`` when missing (idempotent)."""
        self.blobs.mkdir(parents=True, exist_ok=True)
        marker = self.root / "oci-layout"
        if not marker.exists():
            atomic_write(marker, json.dumps({"imageLayoutVersion": mt.IMAGE_LAYOUT_VERSION}).encode())

    def read_index(self) -> dict[str, Any]:
        """The parsed ``index.json``; an empty index when the store does not exist yet.

        Raises StoreError when the file is not a JSON image index."""
        try:
            raw = self.index_path.read_bytes()
        except FileNotFoundError:
            return empty_index()
        try:
            index = json.loads(raw)
        except ValueError as exc:
            raise StoreError(f"corrupt {self.index_path}: {exc}") from exc
        if not isinstance(index, dict) or not isinstance(index.get("manifests", []), list):
            raise StoreError(f"corrupt {self.index_path}: not an OCI image index")
        index.setdefault("manifests", [])
        return index

    def write_index(self, index: dict[str, Any]) -> None:
        """Atomically replace ``index.json``. The caller must hold :meth:`lock`."""
        self.ensure()
        try:
            atomic_write(self.index_path, json.dumps(index, indent=2).encode() + b"\n")
        finally:
            self.changed()

    def blob_path(self, digest: str) -> Path:
        """``<root>/blobs/sha256/<hex>`` for ``sha256:<hex>`` (may not exist). StoreError for bad digests."""
        return self.blobs / digest_hex(digest)

    def has_blob(self, digest: str, size: int | None = None, pin: bool = False) -> bool:
        """True when the blob exists (with ``size`` bytes, when given). ``pin`` is for a writer that is
        about to trust the present blob instead of writing it (a pull, a build): the blob is then
        verified first (:meth:`verify_blob`: a stat when its record matches, else a full hash; a corrupt
        one is removed and this answers False), and protected from gc until a manifest referencing it
        is put (or :data:`PIN_TTL_S` passes); the check and the pin happen under the store lock, so a
        concurrent gc cannot delete the blob in between."""
        path = self.blob_path(digest)
        if not pin:
            return _has_size(path, size)
        if self.verify_blob(digest) != "ok":
            return False
        with self.lock():
            found = _has_size(path, size)
            if found:
                self.pin(digest)
            return found

    # -- verification ------------------------------------------------------------------------------
    def _record_path(self, digest: str) -> Path:
        return self.verified_dir / digest_hex(digest)

    def is_verified(self, digest: str) -> bool:
        """True when the blob exists and its stat matches what was recorded when its bytes were last
        hashed (no read of the data)."""
        try:
            st = os.stat(self.blob_path(digest))
            record = json.loads(self._record_path(digest).read_bytes())
        except (OSError, ValueError):
            return False
        return isinstance(record, dict) and record == _stamp(st)

    def record_verified(self, digest: str, st: os.stat_result | None = None) -> None:
        """Record that the blob's bytes match its digest as the file stands now (``st``, default a fresh
        stat). Only for a caller that just hashed those bytes or published a verified file."""
        st = st if st is not None else os.stat(self.blob_path(digest))
        self.verified_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self._record_path(digest), json.dumps(_stamp(st)).encode())

    def forget_verified(self, digests: Iterable[str]) -> None:
        """Drop the verification records of ``digests`` (their blobs were removed)."""
        for digest in digests:
            with contextlib.suppress(FileNotFoundError, StoreError):
                os.unlink(self._record_path(digest))

    def verify_blob(self, digest: str, *, force: bool = False) -> Check:
        """``ok`` when the blob's bytes match its digest, ``missing`` when it is absent, ``corrupt`` when
        they do not match: the blob is then removed (with its record) and the caller fetches it again.

        A blob whose stat matches its record is ``ok`` without reading it (unless ``force``: the fsck
        of ``llmman verify``); else it is hashed once however many threads ask, and the new stat is
        recorded. StoreError for a malformed digest."""
        path = self.blob_path(digest)
        with self._pins_lock:
            gate = self._verify_locks.setdefault(digest, threading.Lock())
        with gate:
            if not force and self.is_verified(digest):
                return "ok"
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return "missing"
            try:
                before = os.fstat(fd)
                h = hashlib.sha256()
                while chunk := os.read(fd, 4 * CHUNK):
                    h.update(chunk)
                after = os.fstat(fd)
                if h.hexdigest() == digest_hex(digest):
                    if _stamp(before) == _stamp(after):  # unchanged while it was read
                        try:
                            self.record_verified(digest, after)
                        except OSError as exc:  # a read-only store: verified now, hashed again next time
                            log.debug("cannot record the verification of %s: %s", digest, exc)
                    return "ok"
                try:
                    with self.lock():  # remove what was read, not a good copy published meanwhile
                        with contextlib.suppress(FileNotFoundError):
                            now = os.stat(path)
                            if (now.st_ino, now.st_dev) == (after.st_ino, after.st_dev):
                                os.unlink(path)
                                self.changed()
                        self.forget_verified([digest])
                except OSError as exc:  # a read-only store: still corrupt, still refused
                    log.warning("cannot remove corrupt blob %s: %s", digest, exc)
                return "corrupt"
            finally:
                os.close(fd)

    def read_blob(self, digest: str, limit: int = 16 << 20) -> bytes:
        """A small blob's bytes (manifests, configs). StoreError when missing or over ``limit`` bytes."""
        path = self.blob_path(digest)
        try:
            if path.stat().st_size > limit:
                raise StoreError(f"blob {digest} is larger than {limit} bytes")
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise StoreError(f"blob {digest} is missing from the store") from exc

    def pin(self, digest: str) -> None:
        """Protect ``digest`` from gc while it is not yet referenced: in this process by the pin itself,
        in other processes by a shared flock on ``writers.lock`` held while this process has any pin
        (their gc then deletes no blob, see :meth:`others_writing`). Call with the store lock held."""
        with self._pins_lock:
            if not self._pins:
                self._writers_flock(fcntl.LOCK_SH)
            self._pins[digest] = time.monotonic()

    def unpin(self, digests: Iterable[str]) -> None:
        """Drop pins (called once a manifest referencing the digests is in the index)."""
        with self._pins_lock:
            had = bool(self._pins)
            for d in digests:
                self._pins.pop(d, None)
            if had and not self._pins:
                self._writers_flock(fcntl.LOCK_UN)

    def others_writing(self) -> bool:
        """True when another process holds pins (an in-flight build or pull): its unreferenced blobs
        are invisible from here, so gc must keep every blob. Call with the store lock held."""
        with self._pins_lock:
            try:
                self._writers_flock(fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                busy = True
            else:
                busy = False
            self._writers_flock(fcntl.LOCK_SH if self._pins else fcntl.LOCK_UN)
            return busy

    def _writers_flock(self, op: int) -> None:
        if self._writers_fd is None:
            self.root.mkdir(parents=True, exist_ok=True)
            self._writers_fd = os.open(self.root / "writers.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._writers_fd, op)

    def pinned(self) -> set[str]:
        """Digests pinned less than :data:`PIN_TTL_S` seconds ago."""
        now = time.monotonic()
        with self._pins_lock:
            return {d for d, t in self._pins.items() if now - t < PIN_TTL_S}

    def write_blob(self, stream: BinaryIO | Iterable[bytes], expected_digest: str | None = None,
                   expected_size: int | None = None) -> str:
        """Stream bytes into a blob, hashing while copying; returns ``sha256:<hex>``.

        The data goes to a flocked ``blobs/sha256/<random>.tmp``, is fsynced, verified against
        ``expected_digest``/``expected_size`` and only then renamed to its digest (a blob already present
        is kept and the temp dropped). The new blob is pinned against gc.

        Raises StoreError on a digest or size mismatch; the temp file is removed on any failure.
        """
        if expected_digest is not None:
            digest_hex(expected_digest)
        self.ensure()
        tmp = self.blobs / f"{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            h, n = hashlib.sha256(), 0
            with os.fdopen(fd, "wb", closefd=False) as f:
                for chunk in _chunks(stream):
                    h.update(chunk)
                    f.write(chunk)
                    n += len(chunk)
                    if expected_size is not None and n > expected_size:
                        raise StoreError(f"blob size mismatch: more than the expected {expected_size} bytes")
                f.flush()
                os.fsync(fd)
            digest = f"sha256:{h.hexdigest()}"
            if expected_size is not None and n != expected_size:
                raise StoreError(f"blob size mismatch: expected {expected_size} bytes, got {n}")
            if expected_digest is not None and digest != expected_digest:
                raise StoreError(f"blob digest mismatch: expected {expected_digest}, got {digest}")
            self.publish_file(Path(tmp), digest)  # pinned and published atomically with respect to gc
            return digest
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        finally:
            os.close(fd)

    def publish_file(self, path: Path, digest: str, *, verified: bool = True) -> None:
        """Move an already verified, fsynced file (in the same file system) to ``blobs/sha256/<hex>``,
        pinned against gc; a blob already present is kept and ``path`` removed. The caller verified
        the bytes (the resumable downloads of :mod:`llmman.registry.download`). A present blob that is
        not verified (:meth:`is_verified`: changed since it was last hashed) is replaced by ``path``.

        ``verified=False`` (``llmman import`` of a file whose source names its digest, not hashed yet):
        no record is written, so the first :meth:`verify_blob` (at the first load) hashes it. ``path``
        may be a hard link or a symlink (an imported file, :mod:`llmman.store.imports.adopt`)."""
        self.ensure()
        with self.lock():
            self.pin(digest)
            final = self.blob_path(digest)
            if final.exists() and self.is_verified(digest):
                os.unlink(path)
            else:
                os.replace(path, final)
                self.changed()
                _fsync_dir(self.blobs)
                if verified:
                    self.record_verified(digest)
                else:
                    self.forget_verified([digest])

    def blob_digests(self) -> list[str]:
        """Every ``sha256:<hex>`` blob present on disk."""
        if not self.blobs.is_dir():
            return []
        return [f"sha256:{p.name}" for p in self.blobs.iterdir() if _HEX.fullmatch(p.name)]

    def remove_stale_temps(self) -> list[Path]:
        """Delete ``*.tmp`` files in the root and blobs folder that no writer holds (flock free) and that
        were not touched for :data:`STALE_TEMP_S` seconds. Returns the removed paths."""
        removed = []
        now = time.time()
        for folder in (self.root, self.blobs):
            if not folder.is_dir():
                continue
            for p in folder.glob("*.tmp"):
                if _is_stale(p, now):
                    removed.append(p)
        return removed


def _stamp(st: os.stat_result) -> dict[str, int]:
    """What a verification record holds: a rewrite in place changes ``mtime_ns`` or ``ctime_ns``."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino,
            "dev": st.st_dev}


def _has_size(path: Path, size: int | None) -> bool:
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    return size is None or st.st_size == size


def _is_stale(path: Path, now: float) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        if now - os.fstat(fd).st_mtime < STALE_TEMP_S:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True
    finally:
        os.close(fd)
