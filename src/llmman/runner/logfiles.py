"""Log files on disk: their names, their rotation by size, and reading them back (tail and follow).

Every log llmman writes (the daemon's own ``llmman.log`` and one ``<model>.log`` per llama-server child,
all under ``<data_dir>/logs``) is rotated the same way, the way :class:`logging.handlers.RotatingFileHandler`
does: when a write would take the file past ``log.file_size`` (default :data:`MAX_BYTES`), ``name.log.2``
becomes ``name.log.3``, ``name.log.1`` becomes ``name.log.2``, ``name.log`` becomes ``name.log.1`` and a
new ``name.log`` is started; ``log.file_count`` (default :data:`BACKUPS`) old files are kept, older ones
are deleted. So a model's logs never take much more than ``(file_count + 1) * file_size`` of disk.

:func:`tail` reads the last lines (going back into ``name.log.1`` and beyond when the current file is
short); :func:`follow` yields the lines written after it started, across rotations: when the file at the
path is no longer the one it has open (another inode) or shrank, it finishes the old one and goes on at
the start of the new one. Both read only the path they are given: callers build it with
:func:`child_log_name` or :data:`DAEMON_LOG`, never from a client's text.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

MAX_BYTES = 10 * 1024 * 1024  # a log file is rotated before it grows past this (log.file_size's default)
BACKUPS = 3  # rotated files kept beside the current one, name.log.1 .. name.log.3 (log.file_count's)
DAEMON_LOG = "llmman.log"  # the daemon's own log in the logs directory
FOLLOW_POLL_S = 0.25  # how often follow() looks for new bytes once it has read everything
_BLOCK = 64 * 1024


def child_log_name(key: str) -> str:
    """The file name of the llama-server log of the scheduler key ``key`` (a reference, plus
    ``#embedding`` for an embedding child): ``docker.io_ai_smollm2_135m.log``."""
    return key.replace("/", "_").replace(":", "_").replace("#", "_") + ".log"


def backup(path: Path, index: int) -> Path:
    """The ``index``-th rotated file of ``path`` (``name.log.1`` is the newest)."""
    return path.with_name(f"{path.name}.{index}")


def rotate(path: Path, backups: int = BACKUPS) -> None:
    """Shift ``path`` to ``path.1`` (and each ``path.i`` to ``path.i+1``, dropping the oldest), like
    :meth:`logging.handlers.RotatingFileHandler.doRollover`. Missing files are skipped.

    Raises:
        OSError: a rename the file system refuses (the caller decides what a failing log costs).
    """
    if backups <= 0:
        path.unlink(missing_ok=True)
        return
    backup(path, backups).unlink(missing_ok=True)
    for index in range(backups - 1, 0, -1):
        older = backup(path, index)
        if older.exists():
            older.replace(backup(path, index + 1))
    if path.exists():
        path.replace(backup(path, 1))


def _last_lines(path: Path, n: int) -> list[bytes]:
    """The last ``n`` complete or final lines of ``path`` (without newlines), reading from its end."""
    try:
        with path.open("rb") as file:
            end = file.seek(0, os.SEEK_END)
            data = b""
            while end > 0 and data.count(b"\n") <= n:
                start = max(0, end - _BLOCK)
                file.seek(start)
                data = file.read(end - start) + data
                end = start
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if end > 0:  # the first piece may be the end of a longer line: drop it unless all of it was read
        lines = lines[1:]
    return lines[-n:] if n > 0 else []


def tail(path: Path, n: int, backups: int = BACKUPS) -> list[str]:
    """The last ``n`` lines of the log at ``path`` (oldest first), from its rotated files too when the
    current one holds fewer. Missing files read as empty."""
    if n <= 0:
        return []
    found: list[bytes] = []
    for index in range(backups + 1):
        part = path if index == 0 else backup(path, index)
        found = _last_lines(part, n - len(found)) + found
        if len(found) >= n:
            break
    return [_text(line) for line in found]


def exists(path: Path, backups: int = BACKUPS) -> bool:
    """True when the log at ``path`` or one of its rotated files is there."""
    return any((path if i == 0 else backup(path, i)).exists() for i in range(backups + 1))


def _replaced(path: Path, fd: int, position: int) -> bool:
    """True when ``path`` is no longer the open file ``fd`` (renamed away or deleted) or was cut shorter
    than ``position``."""
    try:
        now = path.stat()
    except OSError:
        return True
    return now.st_ino != os.fstat(fd).st_ino or now.st_size < position


class Follower:
    """The lines written to the log at ``path`` from the moment it is made (the file is opened at its end
    now, so nothing written after this returns is missed), across rotations: see :meth:`lines`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = self._open(seek_end=True)

    def _open(self, *, seek_end: bool) -> BinaryIO | None:
        try:
            file = self.path.open("rb")
        except FileNotFoundError:
            return None
        if seek_end:
            file.seek(0, os.SEEK_END)
        return file

    def close(self) -> None:
        """Close the open file; idempotent."""
        if self._file is not None:
            file, self._file = self._file, None
            file.close()

    async def lines(self, poll: float = FOLLOW_POLL_S) -> AsyncIterator[str]:
        """Yield each new line (without its newline), forever; the caller stops by closing the generator,
        which closes the file. A rotation (``path`` replaced, or cut shorter) is followed: the rest of the
        old file first, then the new file from its start. A file that does not exist yet is waited for
        (and read from its start)."""
        pending = b""
        try:
            while True:
                if self._file is None:
                    self._file = self._open(seek_end=False)
                    if self._file is None:
                        await asyncio.sleep(poll)
                        continue
                file = self._file
                data = file.read(_BLOCK)
                if data:
                    pending += data
                    *complete, pending = pending.split(b"\n")
                    for line in complete:
                        yield _text(line)
                    continue
                if _replaced(self.path, file.fileno(), file.tell()):
                    rest = pending + file.read()  # what was written to the old file since the last read
                    pending = b""
                    for line in rest.split(b"\n"):
                        if line:
                            yield _text(line)
                    self.close()  # the next turn opens the new file from its start
                    continue
                await asyncio.sleep(poll)
        finally:
            self.close()


def _text(line: bytes) -> str:
    return line.decode("utf-8", errors="replace").rstrip("\r")


def follow(path: Path, poll: float = FOLLOW_POLL_S) -> AsyncIterator[str]:
    """The lines written to ``path`` from now on (:class:`Follower`)."""
    return Follower(path).lines(poll)
