"""Faults in a real aggregation of daemons on 127.0.0.1/.2/.3 whose llama-server is the fake.

``a`` (127.0.0.1) names ``b`` (127.0.0.3, has ``tiny`` loaded), ``c`` (127.0.0.2, stores ``tiny``, names
``a`` back), ``wrong`` (127.0.0.2, accepts another key) and ``hang`` (127.0.0.3, a socket that accepts and
never answers). ``a`` alone stores ``aonly``. The last test kills ``b``.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import Daemon, free_port, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TINY, AONLY = "docker.io/ai/tiny:latest", "docker.io/ai/aonly:latest"
HOP = {"x-llmman-hop": "1"}
KEY = {"Authorization": "Bearer pool"}
REPLY = " ".join(f"w{i}" for i in range(30))


class HangServer:
    """Accepts TCP connections on ``host`` and never sends a byte."""

    def __init__(self, host: str) -> None:
        self.sock = socket.create_server((host, 0))
        self.netloc = f"{host}:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


def fake_daemon(tmp: Path, host: str, names: tuple[str, ...], env: dict[str, str],
                port: int | None = None) -> Daemon:
    make_store(tmp, names)
    (tmp / "bin").mkdir()
    binary = make_fake_binary(tmp / "bin")
    return start_daemon(tmp, host=host, port=port, extra_env={
        "LLMMAN_LLAMA_SERVER": str(binary), "LLMMAN_DEBUG": "1", "LLMMAN_MEMORY": "4GB",
        "FAKE_REPLY": REPLY, "FAKE_TOKEN_DELAY": "0.01", **env})


@dataclass
class Cluster:
    a: Daemon
    b: Daemon
    c: Daemon
    wrong: Daemon
    hang: HangServer

    def name(self, d: Daemon) -> str:
        return d.url.removeprefix("http://")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    mk = tmp_path_factory.mktemp
    hang = HangServer("127.0.0.3")
    started: list[Daemon] = []
    try:
        keys = {"LLMMAN_API_KEYS": "pool"}
        b = fake_daemon(mk("b"), "127.0.0.3", ("tiny",), {**keys, "LLMMAN_NUM_PARALLEL": "12"})
        started.append(b)
        a_port = free_port("127.0.0.1")
        c = fake_daemon(mk("c"), "127.0.0.2", ("tiny",), {**keys, "LLMMAN_PEERS": f"127.0.0.1:{a_port}"})
        started.append(c)
        wrong = fake_daemon(mk("w"), "127.0.0.2", (), {"LLMMAN_API_KEYS": "other"})
        started.append(wrong)
        peers = ", ".join([b.url, c.url, wrong.url, hang.netloc])
        a = fake_daemon(mk("a"), "127.0.0.1", ("aonly",),
                        {"LLMMAN_PEER_API_KEY": "pool", "LLMMAN_PEERS": peers}, port=a_port)
        started.append(a)
        yield Cluster(a, b, c, wrong, hang)
    finally:
        for d in started:
            for child in d.children():
                child.kill()
            d.stop(signal.SIGKILL if d.process.poll() is None else signal.SIGTERM)
        hang.close()


def chat(url: str, model: str = "tiny", headers: dict[str, str] | None = None) -> tuple[int, str]:
    """A streamed /api/chat; (status, the concatenated content or the error)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", url + "/api/chat", json=body, headers={**KEY, **(headers or {})},
                      timeout=60) as r:
        if r.status_code != 200:
            return r.status_code, r.read().decode()
        lines = [json.loads(line) for line in r.iter_lines() if line]
    if "error" in lines[-1]:
        return 599, str(lines[-1]["error"])
    return 200, "".join(str(x.get("message", {}).get("content", "")) for x in lines)


def local_ps(d: Daemon) -> list[str]:
    r = httpx.get(d.url + "/api/ps", headers={**KEY, **HOP}, timeout=10)
    return [str(m["name"]) for m in r.json()["models"]]


def posts(d: Daemon) -> int:
    """How many POST /api/chat the daemon's access log shows (LLMMAN_DEBUG turns it on)."""
    return d.log_text().count('"POST /api/chat HTTP/1.1"')


def test_silent_and_wrong_key_peers_are_skipped_once(cluster: Cluster) -> None:
    assert chat(cluster.b.url, headers=HOP) == (200, REPLY)  # tiny is now loaded on b
    for _ in range(3):
        assert chat(cluster.a.url) == (200, REPLY)
    for _ in range(2):  # /api/show always probes (no recent-placement shortcut): the peers are asked again
        r = httpx.post(cluster.a.url + "/api/show", json={"model": "tiny"}, headers=KEY, timeout=30)
        assert r.status_code == 200, r.text
    log = cluster.a.log_text()
    assert log.count(f"placement of {TINY}: [") >= 3, log
    hang, wrong = cluster.hang.netloc, cluster.name(cluster.wrong)
    assert f"skipping peer {wrong}: /llmman/node answered 401" in log
    # the silent peer cost the first request its 3 s probe, and no later request waited for it: a
    # synchronous probe logs each skip, and there is one (re-probes happen in the background)
    assert f"skipping peer {hang}: TimeoutError" in log
    assert log.count(f"skipping peer {hang}:") == 1, log
    assert log.count(f"skipping peer {wrong}:") == 1
    assert cluster.hang.conns  # it was asked
    assert local_ps(cluster.b) == [TINY] and local_ps(cluster.a) == [] and local_ps(cluster.c) == []


def test_twelve_streams_land_where_the_model_is_loaded(cluster: Cluster) -> None:
    assert chat(cluster.b.url, headers=HOP) == (200, REPLY)
    before = posts(cluster.b)
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda _: chat(cluster.a.url), range(12)))
    assert results == [(200, REPLY)] * 12
    assert posts(cluster.b) - before == 12
    assert len(cluster.b.children()) == 1
    assert not cluster.a.children() and not cluster.c.children()


def test_forwards_one_after_another_share_a_keep_alive_connection(cluster: Cluster) -> None:
    """b's access log names each request's client port: forwards read to the end give their connection
    back to a's pool, so five forwards in a row open at most one new connection to b."""
    assert chat(cluster.b.url, headers=HOP) == (200, REPLY)
    before = cluster.b.log_text()
    seen = set(re.findall(r':(\d+) - "', before))
    for _ in range(5):
        assert chat(cluster.a.url) == (200, REPLY)
    after = cluster.b.log_text()[len(before):]
    seen |= set(re.findall(r':(\d+) - "GET /llmman/node', after))  # probes share the pool
    ports = re.findall(r':(\d+) - "POST /api/chat HTTP/1.1"', after)
    assert len(ports) == 5 and len(set(ports) - seen) <= 1, (ports, seen)


def test_nodes_naming_each_other_never_bounce(cluster: Cluster) -> None:
    a_before, c_before = posts(cluster.a), posts(cluster.c)
    status, text = chat(cluster.c.url, "aonly")  # c forwards to a, which serves it: one hop only
    assert (status, text) == (200, REPLY)
    assert (posts(cluster.a) - a_before, posts(cluster.c) - c_before) == (1, 1)
    assert f"placement of {AONLY}" in cluster.c.log_text()
    assert f"placement of {AONLY}" not in cluster.a.log_text()
    # a hopped request is served where it lands, even when only the other node has the model
    status, text = chat(cluster.c.url, "aonly", headers=HOP)
    assert status == 404, text
    assert posts(cluster.a) - a_before == 1


def test_killed_peer_costs_only_that_peer(cluster: Cluster) -> None:
    b_name = cluster.name(cluster.b)
    assert chat(cluster.b.url, headers=HOP) == (200, REPLY)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    first_line = threading.Event()
    lines: list[bytes] = []

    def stream() -> None:
        with httpx.stream("POST", cluster.a.url + "/api/chat", json=body, headers=KEY, timeout=60) as r:
            for line in r.iter_lines():
                lines.append(line.encode())
                first_line.set()
        first_line.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert first_line.wait(30)
    children = cluster.b.children()
    cluster.b.process.kill()
    for child in children:
        child.kill()
    psutil.wait_procs(children, timeout=10)
    cluster.b.process.wait(10)
    reader.join(30)
    assert not reader.is_alive()
    assert b'"done":true' not in lines[-1]  # the broken stream ended without claiming success
    for _ in range(4):
        assert chat(cluster.a.url) == (200, REPLY)
    assert local_ps(cluster.c) == [TINY]
    assert cluster.a.log_text().count(f"peer {b_name} left out") == 1
