"""Fault catalogue: unbounded request bodies (issue 13 item 9), against a real ``llmman serve`` (the fake
llama-server as its child; nothing here reaches one).

Before: no body size limit (4 concurrent 100 MB bodies took the daemon to 1.4 GB), and a connection that
never finished its body was held forever (600 of them blocked a daemon with 512 descriptors). Now a
``Content-Length`` over ``server.max_body_size`` gets 413 in the route's dialect before the body is read, a
chunked body is cut off with 413 once past it, a client that stops sending gets 408 after
``server.body_timeout``, each with the connection closed; blob uploads stream past the size limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.integration.daemons import Daemon
from tests.integration.test_faults_fake import fake_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LIMIT = 1 << 20


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = fake_daemon(tmp_path_factory.mktemp("body"), {"LLMMAN_MAX_BODY_SIZE": "1MiB",
                                                     "LLMMAN_BODY_TIMEOUT": "1s"})
    try:
        yield d
    finally:
        d.stop()


def _connect(d: Daemon) -> socket.socket:
    host, port = d.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the daemon sends until it closes the connection (the test's socket timeout bounds it)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def _status_and_body(raw: bytes) -> tuple[int, bytes, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head.lower(), body


DIALECTS = [("/api/chat", b'{"error":"request body too large'),
            ("/v1/chat/completions", b'"type":"invalid_request_error"'),
            ("/v1/messages", b'{"type":"error","error":{"type":"request_too_large"'),
            ("/v1/responses", b'"message":"request body too large')]


@pytest.mark.parametrize(("path", "shape"), DIALECTS)
def test_declared_oversized_body_is_413_before_it_is_sent(daemon: Daemon, path: str, shape: bytes) -> None:
    with _connect(daemon) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {100 << 20}\r\n\r\n".encode() + b'{"model": "tiny"')
        status, head, body = _status_and_body(_read_all(sock))  # answered (and closed) with 100 MB unsent
    assert status == 413, body
    assert b"connection: close" in head
    assert b"request body too large" in body and b"LLMMAN_MAX_BODY_SIZE" in body, body
    assert b"Traceback" not in body


def test_chunked_oversized_body_is_cut_off_with_413(daemon: Daemon) -> None:
    with _connect(daemon) as sock:
        sock.sendall(b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: application/json\r\n\r\n")
        chunk = b"x" * 65536
        sent = 0
        try:
            while sent < 8 * LIMIT:  # never reached: the daemon answers and closes after LIMIT
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except OSError:
            pass  # the daemon closed the connection under us (reset): what it sent is still readable
        raw = _read_all(sock)
    status, _, body = _status_and_body(raw)
    assert status == 413, body
    assert sent < 8 * LIMIT


def test_stalled_body_is_408_and_closed(daemon: Daemon) -> None:
    with _connect(daemon) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n"
                     b"Content-Type: application/json\r\n\r\n{\"model\"")
        status, head, body = _status_and_body(_read_all(sock))  # the daemon closes after its timeout
    assert status == 408 and b"connection: close" in head, body
    assert b'"type":"invalid_request_error"' in body or b"request body not received" in body, body


def test_many_stalled_clients_hold_no_descriptors(daemon: Daemon) -> None:
    process = psutil.Process(daemon.process.pid)
    before = process.num_fds()
    socks = [_connect(daemon) for _ in range(100)]
    try:
        for sock in socks:
            sock.sendall(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50\r\n\r\n{")
        for sock in socks:
            assert _status_and_body(_read_all(sock))[0] == 408
    finally:
        for sock in socks:
            sock.close()
    wait_until(lambda: process.num_fds() <= before + 2, "the daemon to close every stalled connection")
    assert httpx.get(daemon.url + "/api/version", timeout=10).status_code == 200


def test_blob_upload_streams_past_the_size_limit(daemon: Daemon) -> None:
    data = b"\0" * (3 * LIMIT)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r = httpx.post(f"{daemon.url}/api/blobs/{digest}", content=data, timeout=60)
    assert r.status_code == 201, r.text
    assert httpx.head(f"{daemon.url}/api/blobs/{digest}", timeout=10).status_code == 200


def test_a_body_under_the_limit_is_served(daemon: Daemon) -> None:
    body = {"model": "nope", "messages": [{"role": "user", "content": "x" * (LIMIT // 2)}], "stream": False}
    r = httpx.post(f"{daemon.url}/api/chat", json=body, timeout=60)
    assert r.status_code == 404, r.text  # read whole and judged: the model is not there


def test_the_default_limit_is_64_mib(tmp_path: Path) -> None:
    from llmman.config.settings import load_settings

    settings = load_settings(env={}, system_file=tmp_path / "a", user_file=tmp_path / "b")
    assert (settings.max_body_size, settings.body_timeout) == (64 << 20, 60.0)


def test_stalled_blob_upload_is_408_and_leaves_no_blob(daemon: Daemon) -> None:
    digest = "sha256:" + hashlib.sha256(b"y" * 1000).hexdigest()
    with _connect(daemon) as sock:
        sock.sendall(f"POST /api/blobs/{digest} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n"
                     .encode() + b"y" * 10)
        status, head, body = _status_and_body(_read_all(sock))
    assert status == 408 and b"connection: close" in head, body
    assert httpx.head(f"{daemon.url}/api/blobs/{digest}", timeout=10).status_code == 404

    def no_partial_file() -> bool:  # the writer thread drops its temp file once the stream ends
        try:
            return not [p for p in daemon.store.rglob("*") if p.is_file() and p.stat().st_size == 10]
        except FileNotFoundError:  # removed while we looked
            return False

    wait_until(no_partial_file, "the half-uploaded blob's temp file to go")


@pytest.mark.parametrize("sent", [b"", b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"],
                         ids=["nothing", "half-headers"])
def test_stalled_headers_are_closed(daemon: Daemon, sent: bytes) -> None:
    """Before the app sees a request: uvicorn alone held these forever (its keep-alive timer starts only
    after an answer)."""
    with _connect(daemon) as sock:
        sock.sendall(sent)
        assert _read_all(sock) == b""  # closed by the daemon after server.body_timeout, nothing sent


def test_kept_alive_connection_serves_again_then_times_out_idle_headers(daemon: Daemon) -> None:
    with _connect(daemon) as sock:
        for _ in range(2):
            sock.sendall(b"GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = b""
            while b"}" not in answer:
                answer += sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200"), answer
        sock.sendall(b"GET /api/version HTTP/1.1\r\nHo")
        assert _read_all(sock) == b""


def test_600_stalled_clients_against_512_descriptors(daemon: Daemon) -> None:
    """The issue's case: 600 connections that never finish their body, the daemon limited to 512
    descriptors. Each is answered (408) or closed once its timeout passes, and then the daemon serves."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1024:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    before = resource.prlimit(daemon.process.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(daemon.process.pid, resource.RLIMIT_NOFILE, (512, before[1]))  # the soft limit
    socks: list[socket.socket] = []
    try:
        for _ in range(600):
            sock = _connect(daemon)  # accepted at once or held in the listen backlog until a descriptor frees
            sock.sendall(b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99\r\n\r\n{")
            socks.append(sock)
        for sock in socks:
            with contextlib.suppress(ConnectionResetError):
                raw = _read_all(sock)
                assert raw == b"" or _status_and_body(raw)[0] == 408, raw[:200]
    finally:
        for sock in socks:
            sock.close()
        resource.prlimit(daemon.process.pid, resource.RLIMIT_NOFILE, before)
    assert httpx.get(daemon.url + "/api/version", timeout=30).status_code == 200
