"""Session 7's attack findings, each a test that failed before its fix (brief s7/a_attack).

- The blob server (llmman.api.blobserver) bounded each read of a request head by HEAD_TIMEOUT_S, not the
  whole head: a client dripping one byte at a time (slowloris) kept its slot, and 64 of them every slot.
- A lent worker that was stopped (SIGSTOP) still had its lease renewed: its process
  existed, so its owner's llama-server waited on it for ever and the stream under it hung with no error.
- A lease's ``owner`` or ``model`` with control characters (a newline) forged lines in the lender's log.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.test_rpc_lending import Node, until
from tests.unit.test_rpc_worker import gone

from llmman.api import blobserver
from llmman.api.blobserver import BlobServer
from llmman.api.rpc_routes import worker_request
from llmman.errors import BadRequest
from llmman.sched.lending import WorkerGone
from llmman.store import Store

HEAD_S = 0.5  # the head timeout the tests run the blob server with


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[BlobServer]:
    monkeypatch.setattr(blobserver, "HEAD_TIMEOUT_S", HEAD_S)
    s = BlobServer(Store(tmp_path / "store"), "127.0.0.1")
    try:
        yield s
    finally:
        s.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    """True when the other end closed ``sock`` (EOF or a reset), without blocking."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def test_a_request_head_dripped_byte_by_byte_loses_its_slot(server: BlobServer) -> None:
    """The head has HEAD_TIMEOUT_S in all, however it trickles in: a byte every fifth of it, for twelve
    times that long, must see the server close the connection (before the fix it stayed open to the end)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"GET /blobs/sha256:00 HTTP/1.1\r\nX-Slow: ")
        closed = False
        for _ in range(60):  # the attacker's pace, not a synchronisation
            time.sleep(HEAD_S / 5)
            if _closed_by_peer(sock):
                closed = True
                break
            try:
                sock.sendall(b"a")
            except OSError:
                closed = True
                break
        assert closed, "a client dripping its request head kept its blob-server slot"


def test_a_prompt_client_on_a_kept_alive_connection_is_served(server: BlobServer) -> None:
    """The bound is per request head: a client that sends its heads at once is answered each time."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        for _ in range(3):
            sock.sendall(b"HEAD /blobs/sha256:00?e=1&s=x HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                chunk = sock.recv(4096)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 403 "), answer


async def test_a_stopped_worker_is_gone_at_its_next_renewal(tmp_path: Path) -> None:
    """SIGSTOP of a worker: the renewal answers 404 (its owner ends the split: nothing waits on it for ever),
    the worker is stopped and its memory given back."""
    node = Node(tmp_path)
    try:
        lent = await node.lending.lend("o", "m", 400)
        pid = lent.worker.pid
        assert pid is not None and node.lending.renew(lent.id)
        os.kill(pid, signal.SIGSTOP)
        try:
            await until(lambda: _stopped(pid), "the worker to be stopped")
            with pytest.raises(WorkerGone):
                node.lending.renew(lent.id)
            await asyncio.wait_for(lent.worker.exited.wait(), 30)
            await until(lambda: node.scheduler.reserved == 0, "its memory to be given back")
            assert gone(pid) and node.lending.listing() == []
        finally:
            if not gone(pid):
                os.kill(pid, signal.SIGCONT)
    finally:
        await node.close()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


@pytest.mark.parametrize("key", ["owner", "model"])
def test_a_lease_with_control_characters_in_its_names_is_refused(key: str) -> None:
    """``owner`` and ``model`` go into the lender's log lines and listing: a newline in them forged log
    lines (``lent an RPC worker ... to a\\nERROR ...``)."""
    with pytest.raises(BadRequest):
        worker_request(json.dumps({"memory": 1, key: "peer\nERROR llmman: forged"}).encode())
    assert getattr(worker_request(json.dumps({"memory": 1, key: "docker.io/ai/gemma3:270m"}).encode()),
                   key) == "docker.io/ai/gemma3:270m"
