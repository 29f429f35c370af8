"""Where a forwarded model is copied from; peers that go silent (real daemons, fake llama-server).

* ``x-llmman-source`` naming a host that is not a configured peer is ignored: the node never contacts
  it (nor shows it the peer key).
* ``a`` (127.0.0.11, stores ``tiny``, a cap too small to load it) forwards to ``b`` (127.0.0.12, room,
  not storing it) naming itself as ``*``; the connection comes from 127.0.0.1, so ``b`` finds the
  storer by asking its peers and copies from 127.0.0.11.
* ``c`` names two fake peers that claim a model loaded: one never answers the POST (``c`` serves it
  itself after ``LLMMAN_LOAD_TIMEOUT``), one stops mid-stream (the stream ends with an in-band error).
"""

from __future__ import annotations

import http.server
import json
import signal
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.daemons import Daemon, free_port, start_daemon
from tests.integration.test_aggregation_faults import REPLY, fake_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TINY = "docker.io/ai/tiny:latest"
HOP = {"x-llmman-hop": "1"}
SILENCE_S = 2.0  # LLMMAN_LOAD_TIMEOUT of the node forwarding to the fake peers


class FakePeer:
    """An HTTP server on ``host`` that says ``model`` is loaded and, on a POST, records it and then
    either never answers (``partial`` None) or sends the headers and ``partial`` then goes silent."""

    def __init__(self, host: str, model: str, partial: bytes | None = None) -> None:
        self.posts: list[dict[str, str]] = []
        self.gets: list[str] = []
        self.release = threading.Event()
        peer = self
        doc = json.dumps({"memory": 10**12, "free": 10**12, "loaded": {model: 1000}, "stored": {model: 1000},
                          "in_flight": 0, "queued": 0, "max_queue": 512}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                peer.gets.append(self.path)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(doc)))
                self.end_headers()
                self.wfile.write(doc)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                peer.posts.append(dict(self.headers))
                if partial is not None:
                    self.send_response(200)
                    self.send_header("content-type", "application/x-ndjson")
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(partial), partial))
                    self.wfile.flush()
                peer.release.wait(120)

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server((host, 0), Handler)
        self.netloc = f"{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def stop(daemons: list[Daemon]) -> None:
    for d in daemons:
        for child in d.children():
            child.kill()
        d.stop(signal.SIGKILL if d.process.poll() is None else signal.SIGTERM)


def chat(url: str, model: str = "tiny",
         headers: dict[str, str] | None = None) -> tuple[int, list[dict[str, object]]]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", url + "/api/chat", json=body, headers=headers or {}, timeout=60) as r:
        if r.status_code != 200:
            return r.status_code, [json.loads(r.read())]
        return 200, [json.loads(line) for line in r.iter_lines() if line]


def content(lines: list[dict[str, object]]) -> str:
    messages = [x.get("message") for x in lines]
    return "".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


def test_a_source_that_is_no_configured_peer_is_never_contacted(tmp_path: Path) -> None:
    bait = FakePeer("127.0.0.15", "docker.io/ai/other:1")
    peer_port = free_port("127.0.0.12")
    node = fake_daemon(tmp_path, "127.0.0.11", (), {"LLMMAN_PEERS": f"127.0.0.12:{peer_port}",
                                                     "LLMMAN_PEER_API_KEY": "secret"})
    try:
        for source in (f"http://{bait.netloc}", f"http://*:{bait.netloc.split(':')[1]}"):
            status, body = chat(node.url, headers={**HOP, "x-llmman-source": source})
            assert status == 404, body  # offline, not stored, no configured peer to copy from
        assert bait.gets == [] and bait.posts == []
        log = node.log_text()
        assert bait.netloc not in log and "copying" not in log, log
    finally:
        stop([node])
        bait.close()


def test_a_star_source_is_resolved_to_the_peer_storing_the_model(tmp_path: Path) -> None:
    a_port, b_port = free_port("127.0.0.11"), free_port("127.0.0.12")
    started: list[Daemon] = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
        b = fake_daemon(tmp_path / "b", "127.0.0.12", (), {"LLMMAN_PEERS": f"127.0.0.11:{a_port}"},
                        port=b_port)
        started.append(b)
        a = fake_daemon(tmp_path / "a", "127.0.0.11", ("tiny",), {
            "LLMMAN_PEERS": f"127.0.0.12:{b_port}", "LLMMAN_MEMORY": "10KB"}, port=a_port)
        started.append(a)
        status, lines = chat(a.url)
        assert status == 200 and content(lines) == REPLY, lines
        assert f"copying {TINY} from peer 127.0.0.11:{a_port}" in b.log_text(), b.log_text()
        tags = httpx.get(b.url + "/api/tags", headers=HOP, timeout=10).json()["models"]
        a_tags = httpx.get(a.url + "/api/tags", headers=HOP, timeout=10).json()["models"]
        assert [m["digest"] for m in tags] == [m["digest"] for m in a_tags]  # the pinned digest, copied
    finally:
        stop(started)


@pytest.fixture(scope="module")
def silent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, FakePeer, FakePeer]]:
    hang = FakePeer("127.0.0.13", TINY)
    stall = FakePeer("127.0.0.14", "docker.io/ai/stall:latest",
                     partial=b'{"model":"stall","message":{"role":"assistant","content":"w0"},"done":false}\n')
    node = fake_daemon(tmp_path_factory.mktemp("c"), "127.0.0.11", ("tiny",), {
        "LLMMAN_PEERS": f"{hang.netloc}, {stall.netloc}", "LLMMAN_LOAD_TIMEOUT": f"{SILENCE_S:g}s"})
    yield node, hang, stall
    stop([node])
    hang.close()
    stall.close()


def test_a_peer_that_never_answers_is_given_up_after_the_load_timeout(
        silent: tuple[Daemon, FakePeer, FakePeer]) -> None:
    node, hang, _ = silent
    status, lines = chat(node.url)
    assert status == 200 and content(lines) == REPLY, lines  # served here, the next candidate
    assert len(hang.posts) == 1
    log = node.log_text()
    assert f"peer {hang.netloc} left out: Timeout on reading data from socket" in log, log


def test_a_peer_that_stalls_mid_stream_ends_it_with_an_in_band_error(
        silent: tuple[Daemon, FakePeer, FakePeer]) -> None:
    node, _, stall = silent
    status, lines = chat(node.url, "stall")
    assert status == 200
    assert lines[0]["message"] == {"role": "assistant", "content": "w0"}
    assert f"peer {stall.netloc} stalled mid-answer" in str(lines[-1].get("error")), lines
    assert len(stall.posts) == 1


def test_a_peer_without_host_fails_the_start_cleanly(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="exited") as failed:
        start_daemon(tmp_path, extra_env={"LLMMAN_PEERS": "127.0.0.12:17434, http://"}, ready_timeout=30)
    text = str(failed.value)
    assert "aggregation.peers: 'http://' names no host" in text
    assert "Unclosed" not in text and "Traceback" not in text


def test_a_node_naming_itself_leaves_itself_out(tmp_path: Path) -> None:
    port = free_port("127.0.0.11")
    node = fake_daemon(tmp_path, "127.0.0.11", ("tiny",), {"LLMMAN_PEERS": f"http://127.0.0.11:{port}"},
                       port=port)
    try:
        assert f"127.0.0.11:{port} is this node itself" in node.log_text()
        assert chat(node.url)[0] == 200
        assert "placement of" not in node.log_text()  # no peers left: nothing to place among
    finally:
        stop([node])
