"""Fault catalogue: a full log disk (issue 13 item 3), against a real ``llmman serve`` over the fake
llama-server.

The daemon's ``logs/`` directory is a real 256 KiB tmpfs, mounted by the test (tests run as root in CI)
and filled to the last byte once the model is loaded, so every later write of the child's log fails
with ENOSPC exactly as on a full disk; the test skips where mounting is not allowed. A second test
needs no privilege: the child's log file is a symlink to ``/dev/full`` (every write fails with ENOSPC)
from the start, so the write error is injected rather than real.

Before the fix the log reader died on the first failed write (its task raised, nobody saw it), and
the unload that followed raised while writing its ``stopping`` note, before it signalled the child:
the llama-server kept running, untracked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.daemons import Daemon
from tests.integration.test_faults_fake import alive, chat, fake_daemon, ps_entry, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOG_NAME = "docker.io_ai_tiny_latest.log"


@contextlib.contextmanager
def small_tmpfs(where: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs mounted at ``where``; skips the test where mounting is not allowed."""
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill_file(path: Path, block: int) -> None:
    with path.open("ab", buffering=0) as out:
        try:
            while True:
                out.write(b"\n" * block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def fill(directory: Path) -> Path:
    """Fill ``directory``'s file system to the last byte, the child's log file's last page included
    (tmpfs allocates pages: a file's partly used page takes appends on a full file system); the
    filler file's path."""
    filler = directory / "filler"
    _fill_file(filler, 4096)
    _fill_file(directory / LOG_NAME, 1)
    return filler


def unload(d: Daemon) -> httpx.Response:
    return httpx.post(d.url + "/api/generate", json={"model": "tiny", "keep_alive": 0}, timeout=30)


def test_full_log_disk_keeps_supervising_and_unload_ends_the_child(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "logs") as logs:
        d = fake_daemon(tmp_path, {"LLMMAN_SHUTDOWN_GRACE": "5s"})
        try:
            with d.client(timeout=30) as client:
                assert client.post("/api/generate", json={"model": "tiny"}).json()["done_reason"] == "load"
                entry = ps_entry(d, "tiny")
                assert entry is not None
                pid = entry["pid"]
                filler = fill(logs)
                # The child logs each request: those writes now fail; answers must not.
                for _ in range(3):
                    answer = client.post("/api/chat", json=chat("tiny", stream=False))
                    assert answer.status_code == 200, answer.text
                wait_until(lambda: "cannot write the llama-server log" in d.log_text(),
                           "the daemon to say the log cannot be written")  # fmt: skip
                # Room again: the reader was still draining, so the next request's line reaches the file.
                filler.unlink()
                before = (logs / LOG_NAME).read_text()
                assert client.post("/api/chat", json=chat("tiny", stream=False)).status_code == 200
                wait_until(lambda: (logs / LOG_NAME).read_text().count("request: POST")
                           > before.count("request: POST"), "the log file to resume")  # fmt: skip
                fill(logs)  # and full again for the unload
                assert unload(d).json()["done_reason"] == "unload"
                wait_until(lambda: not alive(pid), "the unloaded child to be gone", timeout=20)
                assert ps_entry(d, "tiny") is None
                assert not [p for p in d.children() if alive(p.pid)]  # no orphan llama-server
                assert d.log_text().count("cannot write the llama-server log") == 1  # said once
                assert "Traceback" not in d.log_text()
                # And the model loads again as usual.
                again = client.post("/api/chat", json=chat("tiny", stream=False))
                assert again.status_code == 200, again.text
        finally:
            if d.process.poll() is None:
                d.stop(signal.SIGTERM)
            assert not [p for p in d.children() if alive(p.pid)]


def test_log_file_failing_from_the_start_still_serves_and_unloads(tmp_path: Path) -> None:
    """Injected: the child's log file is /dev/full (ENOSPC on every write), before the first load."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / LOG_NAME).symlink_to("/dev/full")
    d = fake_daemon(tmp_path, {"LLMMAN_SHUTDOWN_GRACE": "5s"})
    try:
        with d.client(timeout=30) as client:
            answer = client.post("/api/chat", json=chat("tiny", stream=False))
            assert answer.status_code == 200, answer.text
            entry = ps_entry(d, "tiny")
            assert entry is not None
            pid = entry["pid"]
            assert unload(d).json()["done_reason"] == "unload"
            wait_until(lambda: not alive(pid), "the unloaded child to be gone", timeout=20)
            assert d.log_text().count("cannot write the llama-server log") == 1
    finally:
        if d.process.poll() is None:
            d.stop(signal.SIGTERM)
