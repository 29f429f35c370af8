"""The download's early write-back (``llmman.registry.download._Writeback``): while a blob is written, the
disk writes of each :data:`~llmman.registry.download.WRITEBACK_STEP` are started with the real
``sync_file_range(2)``, in order and without gaps, so the final ``fsync`` has only the tail left."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from llmman.registry import download
from llmman.registry.download import WRITEBACK_STEP, _Writeback

pytestmark = pytest.mark.skipif(download._sync_file_range is None, reason="no sync_file_range (not Linux)")


def test_write_back_covers_each_step_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = download._sync_file_range
    assert real is not None
    calls: list[tuple[int, int]] = []

    def recorded(fd: int, start: object, length: object, flags: int) -> int:
        calls.append((int(getattr(start, "value", start)), int(getattr(length, "value", length))))
        return real(fd, start, length, flags)

    monkeypatch.setattr(download, "_sync_file_range", recorded)
    block = os.urandom(1 << 20)
    fd = os.open(tmp_path / "blob.partial", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        writeback = _Writeback(fd, 0)
        written = 0
        for _ in range(3 * WRITEBACK_STEP // len(block) + 3):
            written += os.write(fd, block)
            writeback.advance(written)
        deadline = time.monotonic() + 30  # the thread catches up with the last full step
        while sum(n for _, n in calls) < written - WRITEBACK_STEP and time.monotonic() < deadline:
            time.sleep(0.01)
        writeback.close()
    finally:
        os.close(fd)
    assert calls, "no write-back was started"
    position = 0
    for start, length in calls:
        assert start == position and length >= WRITEBACK_STEP
        position += length
    assert written - WRITEBACK_STEP <= position <= written  # never past what was written; the tail is fsync's


def test_nothing_to_do_below_one_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(download, "_sync_file_range", lambda *args: calls.append(1) or 0)
    fd = os.open(tmp_path / "small.partial", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        writeback = _Writeback(fd, 0)
        writeback.advance(os.write(fd, b"x" * 4096))
        writeback.close()
    finally:
        os.close(fd)
    assert calls == []
