"""A client that goes away from a forwarded request cancels the work on the peer, streamed or not.

``a`` (127.0.0.31) stores nothing; ``b`` (127.0.0.32) stores ``tiny`` and has room, so placement sends
``a``'s requests to ``b``; ``b``'s child is the fake llama-server, one token every 0.2 s of a 200-word
answer (40 s), so a request still running after the client left shows on ``b``'s ``/llmman/node``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import Daemon, free_port, start_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPLY = " ".join(f"w{i}" for i in range(200))


@dataclass
class Pair:
    a: Daemon
    b: Daemon


def _daemon(tmp: Path, host: str, port: int, peer: str, names: tuple[str, ...]) -> Daemon:
    make_store(tmp, names)
    (tmp / "bin").mkdir()
    return start_daemon(tmp, host=host, port=port, extra_env={
        "LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_MEMORY": "4GB",
        "LLMMAN_PEERS": peer, "FAKE_REPLY": REPLY, "FAKE_TOKEN_DELAY": "0.2"})


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    hosts = "127.0.0.31", "127.0.0.32"
    ports = free_port(hosts[0]), free_port(hosts[1])
    b = _daemon(tmp_path_factory.mktemp("b"), hosts[1], ports[1], f"{hosts[0]}:{ports[0]}", ("tiny",))
    try:
        a = _daemon(tmp_path_factory.mktemp("a"), hosts[0], ports[0], f"{hosts[1]}:{ports[1]}", ())
        try:
            yield Pair(a, b)
        finally:
            a.stop()
    finally:
        b.stop()


def in_flight(d: Daemon) -> int:
    r = httpx.get(d.url + "/llmman/node", headers={"x-llmman-hop": "1"}, timeout=10)
    return int(r.json()["in_flight"])


@pytest.mark.parametrize("stream", [False, True], ids=["non-streamed", "streamed"])
def test_a_client_leaving_a_forwarded_request_stops_it_on_the_peer(pair: Pair, stream: bool) -> None:
    body = orjson.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
    host, port = pair.a.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"POST /api/chat HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (f"{host}:{port}".encode(), len(body), body))
        wait_until(lambda: in_flight(pair.b) == 1, "the request running on b")
    # The answer takes 40 s on b; it must end with the client, not with the generation.
    wait_until(lambda: in_flight(pair.b) == 0, "b to stop the work of a client that left", timeout=20)
    assert in_flight(pair.a) == 0
