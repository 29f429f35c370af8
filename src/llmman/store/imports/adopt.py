"""Putting a file the user already has into the store's ``blobs/`` without a second copy of its bytes.

In order of preference (docs/store.md, "Imported models"):

1. **hard link** (``os.link``): the store and the source are on one file system; the blob is an
   ordinary file of the layout, sharing the source's inode;
2. **reflink** (``FICLONE``): where a hard link is refused (another user's files under
   ``fs.protected_hardlinks``) on a file system that clones (btrfs, XFS): a copy that shares the
   extents;
3. **reference**: anywhere else (another file system), the blob is a symlink to the source's absolute
   path. Its verification record (:meth:`llmman.store.layout.Layout.record_verified`) is the source's
   stat, so a changed, replaced or missing source is seen at the next load, never served as the wrong
   model.

The link is made under a flocked temp name in ``blobs/sha256/`` (so gc leaves it alone), hashed there
when the source does not name its digest, then published under the digest
(:meth:`llmman.store.layout.Layout.publish_file`). A source that names its digest (Ollama's blobs, the
Hugging Face cache's) is trusted now and hashed once at its first load, as a blob without a record is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
from pathlib import Path
from typing import Literal

from llmman.errors import StoreError
from llmman.store.imports.found import Part
from llmman.store.layout import CHUNK, Layout

__all__ = ["How", "adopt", "how_stored"]

How = Literal["hard link", "reflink", "reference", "stored"]  # "stored": the store already had the bytes
_FICLONE = 0x40049409  # linux/fs.h _IOW(0x94, 9, int)


def how_stored(layout: Layout, digest: str, source: Path) -> How:
    """How the blob ``digest`` holds ``source``'s bytes now (it must exist)."""
    path = layout.blob_path(digest)
    if path.is_symlink():
        return "reference"
    with contextlib.suppress(OSError):
        if os.path.samefile(path, source):
            return "hard link"
    return "stored"


def _present(layout: Layout, digest: str, source: Path) -> bool:
    """True when the blob is there and needs nothing: it is ``source`` itself (a link made before) or a
    verified copy."""
    path = layout.blob_path(digest)
    with contextlib.suppress(OSError):
        if os.path.samefile(path, source):
            return True
    return layout.is_verified(digest)


def _reflink(source: Path, target: Path) -> bool:
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return False
    try:
        with open(source, "rb") as src:
            fcntl.ioctl(dst, _FICLONE, src.fileno())
        return True
    except OSError:
        os.close(dst)
        dst = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
        return False
    finally:
        if dst >= 0:
            os.close(dst)


def _link(source: Path, target: Path) -> How:
    """Make ``target`` hold ``source`` without copying; returns how."""
    try:
        os.link(source, target)
        return "hard link"
    except OSError:
        pass
    try:
        same_fs = os.stat(source).st_dev == os.stat(target.parent).st_dev
    except OSError:
        same_fs = False
    if same_fs and _reflink(source, target):
        return "reflink"
    os.symlink(source.resolve(), target)
    return "reference"


def _hash(fd: int, size: int, source: Path) -> str:
    before = os.fstat(fd)
    h, n = hashlib.sha256(), 0
    while chunk := os.read(fd, 4 * CHUNK):
        h.update(chunk)
        n += len(chunk)
    after = os.fstat(fd)
    if n != size or (before.st_mtime_ns, before.st_size) != (after.st_mtime_ns, after.st_size):
        raise StoreError(f"{source} changed while it was read; import it again")
    return f"sha256:{h.hexdigest()}"


def adopt(layout: Layout, part: Part) -> tuple[str, How]:
    """Put ``part``'s file in the store as a blob (see the module docstring); returns its digest and
    how it is held. The blob is pinned against gc until a manifest using it is put. Raises StoreError
    when the file cannot be linked, read, or has a size other than the one found."""
    source = part.path
    if part.digest is not None and _present(layout, part.digest, source):
        with layout.lock():
            layout.pin(part.digest)
        return part.digest, how_stored(layout, part.digest, source)
    layout.ensure()
    tmp = layout.blobs / f"{secrets.token_hex(8)}.tmp"
    try:
        how = _link(source, tmp)
        fd = os.open(tmp, os.O_RDONLY)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise StoreError(f"cannot import {source}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a live temp: gc's stale-temp sweep leaves it
        if os.fstat(fd).st_size != part.size:
            raise StoreError(f"{source} is {os.fstat(fd).st_size} bytes, not the {part.size} its source "
                             "says; import it again")
        digest = part.digest if part.digest is not None else _hash(fd, part.size, source)
        if part.digest is None and _present(layout, digest, source):
            os.unlink(tmp)
            with layout.lock():
                layout.pin(digest)
            return digest, how_stored(layout, digest, source)
        layout.publish_file(tmp, digest, verified=part.digest is None)
        return digest, how
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
