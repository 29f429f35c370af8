"""``/llmman/drain`` with a name two peers report: refused (409), never a guess at which machine to drain.

Two machines left at one default host name (``raspberrypi``) report the same ``node.name``; a rolling
upgrade that drains "the" node of that name must not drain whichever answered first. One real daemon
names two fault-injecting peers (tests/fakes/fake_peer.py) that both report ``twin``.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.fakes.fake_peer import EvilPeer, document, serve_peer
from tests.integration.daemons import Daemon, free_port, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ALPHA, ONE, TWO = "127.0.0.47", "127.0.0.48", "127.0.0.49"


@dataclass
class Setup:
    alpha: Daemon
    peers: dict[str, EvilPeer]  # host:port -> peer


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    peers, servers = {}, []
    for host in (ONE, TWO):
        peer = EvilPeer(body=document(name="twin"))
        server = serve_peer(peer, host, free_port(host))
        servers.append(server)
        peers[f"{host}:{server.server_address[1]}"] = peer
    alpha = start_daemon(tmp_path_factory.mktemp("alpha"),
                         host=ALPHA, extra_env={"LLMMAN_NODE_NAME": "alpha", "LLMMAN_PEERS": ",".join(peers)})
    try:
        yield Setup(alpha, peers)
    finally:
        alpha.stop(signal.SIGKILL)
        for server in servers:
            server.shutdown()
            server.server_close()


def test_a_name_two_peers_report_is_refused(setup: Setup) -> None:
    r = httpx.post(setup.alpha.url + "/llmman/drain", json={"node": "twin"}, timeout=30)
    assert r.status_code == 409, r.text
    assert all(address in r.json()["error"] for address in setup.peers)
    assert all(peer.posts == [] for peer in setup.peers.values())  # neither was drained
    r = httpx.get(setup.alpha.url + "/llmman/drain", params={"node": "twin"}, timeout=30)
    assert r.status_code == 409, r.text
    assert httpx.get(setup.alpha.url + "/llmman/drain", timeout=30).json()["state"] == "serving"


def test_host_port_names_one_of_them(setup: Setup) -> None:
    first, second = setup.peers
    httpx.post(setup.alpha.url + "/llmman/drain", json={"node": first}, timeout=30)
    assert setup.peers[first].posts == ["/llmman/drain"] and setup.peers[second].posts == []
