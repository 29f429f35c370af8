"""A peer that answers its probes but never answers a request: given up within a stall check, not after
``server.load_timeout``.

The fault-injecting peer (tests/fakes/fake_peer.py) reports ``tiny`` loaded on it, ready and idle, with
four free slots, so a real daemon (``alpha``, which stores ``tiny`` but has no copy loaded) forwards the
request there — and the peer never answers it. The probe made after ``aggregation.stall_timeout`` of
silence answers, but shows the model idle: the request never reached it. The front node fails over
(itself) before the first byte, within the same request; before, the client waited the load timeout. A
stream the peer stops sending after its first line ends with one in-band error the same way.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.fake_peer import EvilPeer, document, serve_peer
from tests.fakes.inprocess import make_store
from tests.integration.daemons import Daemon, free_port, start_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ALPHA, STALLED = "127.0.0.43", "127.0.0.44"
TINY, OTHER = "docker.io/ai/tiny:latest", "docker.io/ai/other:latest"
IDLE = {ref: {"slots": 4, "in_flight": 0, "queued": 0, "loading": False, "draining": False}
        for ref in (TINY, OTHER)}


@dataclass
class Setup:
    alpha: Daemon
    peer: EvilPeer


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("alpha")
    make_store(tmp, ("tiny", "other"))
    (tmp / "bin").mkdir()
    loaded = {ref: 1000 for ref in IDLE}
    peer = EvilPeer(body=document(name="stalled", loaded=loaded, stored=loaded, models=IDLE), hang=True)
    server = serve_peer(peer, STALLED, free_port(STALLED))
    env = {"LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_MEMORY": "4GB",
           "LLMMAN_NODE_NAME": "alpha", "LLMMAN_PEERS": f"{STALLED}:{server.server_address[1]}",
           "LLMMAN_STALL_TIMEOUT": "1s", "LLMMAN_PEER_REFRESH": "0.2"}
    alpha = start_daemon(tmp, host=ALPHA, extra_env=env)
    try:
        yield Setup(alpha, peer)
    finally:
        peer.release.set()
        for child in alpha.children():
            child.kill()
        alpha.stop(signal.SIGKILL)
        server.shutdown()
        server.server_close()


def sees_it_loaded(setup: Setup) -> bool:
    nodes = httpx.get(setup.alpha.url + "/llmman/pool", timeout=30).json()["nodes"]
    return TINY in nodes[1]["models"] and nodes[1]["state"] == "up"


def test_a_request_the_peer_never_answers_fails_over_before_its_first_byte(setup: Setup) -> None:
    wait_until(lambda: sees_it_loaded(setup), "alpha to see tiny loaded and idle on the stalled peer")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    # The load timeout is the default 301 s: a client still waiting after 60 s was never failed over.
    with httpx.stream("POST", setup.alpha.url + "/api/chat", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["x-llmman-node"] == "alpha"  # served by the front node, after the peer was tried
        text = "".join(r.iter_text())
    assert '"done":true' in text and "error" not in text
    assert setup.peer.posts == ["/api/chat"]  # it was tried once, and the request not replayed there
    assert "holds no request for docker.io/ai/tiny:latest" in setup.alpha.log_text()
    assert "Traceback" not in setup.alpha.log_text()


def test_a_stream_the_peer_stops_sending_ends_with_an_in_band_error(setup: Setup) -> None:
    head = b'{"model":"other","message":{"role":"assistant","content":"w0"},"done":false}\n'
    setup.peer.head = head
    setup.peer.posts.clear()
    wait_until(lambda: sees_it_loaded(setup), "alpha to take the stalled peer back")
    body = {"model": "other", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", setup.alpha.url + "/api/chat", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[0].encode() + b"\n" == head and len(lines) == 2, lines
    assert "error" in json.loads(lines[1]), lines  # the one in-band error, after the first byte
    assert setup.peer.posts == ["/api/chat"]
    assert "holds no request for docker.io/ai/other:latest" in setup.alpha.log_text()
    assert "Traceback" not in setup.alpha.log_text()
