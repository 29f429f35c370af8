"""A hostile or broken peer's ``/llmman/node`` against a real daemon: it must cost the node nothing.

One real daemon (``alpha``, its llama-server the fake) names one peer: the fault-injecting peer of
tests/fakes/fake_peer.py (it is no llmman), whose ``/llmman/node`` answer each test sets. Checked: a
peer that takes 2.5 s to answer does not make every decision probe and wait; a deeply nested document,
figures beyond 64 bits or negative, a models table of 100 000 entries and a document over the size taken
leave ``/llmman/pool``, inference and a stop answering (200, never a 500), with no traceback in the
daemon's log; ``/llmman/drain`` refuses odd bodies in its dialect; a peer reporting this node's name does
not take its drain.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.fake_peer import EvilPeer, document, serve_peer
from tests.fakes.inprocess import make_store
from tests.integration.daemons import Daemon, free_port, start_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ALPHA, EVIL = "127.0.0.45", "127.0.0.46"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}
STOP = {"model": "tiny", "keep_alive": 0}


@dataclass
class Setup:
    alpha: Daemon
    evil: EvilPeer
    evil_address: str


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("alpha")
    make_store(tmp, ("tiny",))
    (tmp / "bin").mkdir()
    evil = EvilPeer()
    server = serve_peer(evil, EVIL, free_port(EVIL))
    address = f"{EVIL}:{server.server_address[1]}"
    env = {"LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_MEMORY": "4GB",
           "LLMMAN_NODE_NAME": "alpha", "LLMMAN_PEERS": address, "LLMMAN_PEER_REFRESH": "0.2",
           "LLMMAN_DEBUG": "1"}
    alpha = start_daemon(tmp, host=ALPHA, extra_env=env)
    try:
        yield Setup(alpha, evil, address)
    finally:
        for child in alpha.children():
            child.kill()
        alpha.stop(signal.SIGKILL)
        server.shutdown()
        server.server_close()


def fed(setup: Setup, body: bytes) -> None:
    """Make the peer answer ``body`` and wait until the daemon has fetched it twice since."""
    before = setup.evil.set(body)
    wait_until(lambda: setup.evil.asked >= before + 2, "the daemon to fetch the new document", timeout=60)


def peer_entry(setup: Setup) -> dict[str, Any]:
    """The peer as ``/llmman/pool`` shows it (the answer must be a 200)."""
    r = httpx.get(setup.alpha.url + "/llmman/pool", timeout=60)
    assert r.status_code == 200, r.text
    entry: dict[str, Any] = next(n for n in r.json()["nodes"] if n["address"] == setup.evil_address)
    return entry


def serves(setup: Setup) -> None:
    """Inference and a stop still answer 200 (the local copy serves; the peer's 503 is not final)."""
    r = httpx.post(setup.alpha.url + "/api/chat", json=CHAT, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(setup.alpha.url + "/api/generate", json=STOP, timeout=60)
    assert r.status_code == 200, r.text


def no_traceback(setup: Setup) -> None:
    text = setup.alpha.log_text()
    assert "Traceback" not in text and "never retrieved" not in text, text[-4000:]


def test_a_peer_slow_to_answer_does_not_make_every_decision_wait(setup: Setup) -> None:
    setup.evil.delay = 2.5  # under the probe's 3 s: up, but every fetch of it takes that long
    try:
        fed(setup, document())
        wait_until(lambda: peer_entry(setup)["state"] == "up", "the peer to be up")
        rounds = setup.alpha.log_text().count("probe round")
        for _ in range(6):  # each reads the views; it probed (and waited 2.5 s) when they were stale
            assert peer_entry(setup)["state"] == "up"
        assert setup.alpha.log_text().count("probe round") == rounds
        serves(setup)
    finally:
        setup.evil.delay = 0.0


def test_a_deeply_nested_document_is_not_a_node_document(setup: Setup) -> None:
    fed(setup, b"[" * 100_000 + b"]" * 100_000)
    entry = peer_entry(setup)
    assert entry["state"] == "down" and "depth" in entry["why"], entry
    serves(setup)
    fed(setup, b'{"memory": 1, "loaded": {}, "stored": {}, "models": ' + b'{"a": ' * 50_000 + b"1"
        + b"}" * 50_000 + b"}")
    assert peer_entry(setup)["state"] == "down"
    serves(setup)
    no_traceback(setup)


def test_figures_beyond_64_bits_or_negative_are_clamped(setup: Setup) -> None:
    fed(setup, document(memory=2**64 - 1, loaded={"docker.io/ai/x:latest": -(2**63)},
                        stored={"docker.io/ai/x:latest": 2**64 - 1},
                        models={"docker.io/ai/x:latest": {"slots": 2**64 - 1, "in_flight": -7,
                                                          "queued": 2**64 - 2}}))
    wait_until(lambda: peer_entry(setup)["state"] == "up", "the peer to be up again")
    entry = peer_entry(setup)
    assert entry["memory"] == 2**63 - 1 and entry["free"] == 2**63 - 1  # a negative load adds no room
    load = entry["models"]["docker.io/ai/x:latest"]
    assert (load["slots"], load["in_flight"], load["queued"], load["size"]) == (2**63 - 1, 0, 2**63 - 1, 0)
    serves(setup)
    no_traceback(setup)


def test_a_peer_with_100k_models_loaded_is_shown(setup: Setup) -> None:
    many = {f"docker.io/ai/m{i}:latest": {"slots": 1, "in_flight": 0, "queued": 0} for i in range(100_000)}
    fed(setup, document(models=many, loaded={ref: 1 for ref in many}))
    # Each entry's size was looked up by a scan of every loaded model: 10^10 steps, the node hung.
    wait_until(lambda: peer_entry(setup)["state"] == "up", "the peer to be up again")
    assert len(peer_entry(setup)["models"]) == 100_000
    serves(setup)
    no_traceback(setup)


def test_a_document_over_the_size_taken_leaves_the_peer_out(setup: Setup) -> None:
    fed(setup, document(stored={f"docker.io/ai/m{i:07d}:latest": 1 for i in range(700_000)}))  # ~24 MB
    entry = peer_entry(setup)
    assert entry["state"] == "down" and "bytes" in entry["why"], entry
    serves(setup)
    no_traceback(setup)


@pytest.mark.parametrize(("body", "status"), [
    (b"not json", 400), (b"[1, 2]", 400), (b'{"node": 5}', 400), (b'{"node": {"a": 1}}', 400),
    (b"[" * 100_000, 400),
    (json.dumps({"node": "evil\r\nx-injected: 1"}).encode(), 404),
    (json.dumps({"node": "n\u00f6de-\u2603"}).encode(), 404),
    (json.dumps({"node": "x" * 100_000}).encode(), 404),
])
def test_drain_refuses_odd_bodies_in_its_dialect(setup: Setup, body: bytes, status: int) -> None:
    fed(setup, document())
    r = httpx.post(setup.alpha.url + "/llmman/drain", content=body, timeout=60)
    assert r.status_code == status, r.text
    assert isinstance(r.json()["error"], str) and "Traceback" not in r.text
    assert "x-injected" not in r.headers
    state = httpx.get(setup.alpha.url + "/llmman/drain", timeout=60).json()
    assert state["state"] == "serving"  # nothing of it drained this node
    no_traceback(setup)


def test_a_peer_reporting_our_own_name_is_not_us(setup: Setup) -> None:
    fed(setup, document(name="alpha"))
    r = httpx.post(setup.alpha.url + "/llmman/drain", json={"node": "alpha"}, timeout=60)
    assert r.status_code == 200 and r.json()["node"] == "alpha", r.text
    assert r.json()["state"] == "draining"  # this node, not the peer that took its name
    r = httpx.post(setup.alpha.url + "/llmman/undrain", json={"node": "alpha"}, timeout=60)
    assert r.status_code == 200 and r.json()["state"] == "serving"
    no_traceback(setup)
