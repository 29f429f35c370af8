"""The pool as each node sees it, through real daemons on 127.0.0.31/.32/.33 whose llama-server is the fake.

``a``, ``b`` and ``c`` name each other (``node.name`` alpha, bravo, charlie). ``b`` and ``c`` store ``tiny``;
``c`` alone stores ``conly``. Checked: ``GET /llmman/pool`` from each node shows all three with this node
marked ``self``; a model loaded on ``b`` appears in ``a``'s view by the background refresh; a cold request
on ``a`` while its views are fresh makes no probe round (``LLMMAN_DEBUG`` logs each one); ``llmman nodes``
prints the table and the JSON; a killed ``c`` shows ``down`` and comes back ``up`` once restarted.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import HOP, Daemon, free_port, local_ps, start_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TINY = "docker.io/ai/tiny:latest"
CONLY = "docker.io/ai/conly:latest"
HOSTS = {"alpha": "127.0.0.31", "bravo": "127.0.0.32", "charlie": "127.0.0.33"}
REPLY = "w0 w1 w2 w3"


@dataclass
class Pool:
    nodes: dict[str, Daemon]
    dirs: dict[str, Path]
    envs: dict[str, dict[str, str]]
    ports: dict[str, int]

    def address(self, name: str) -> str:
        return f"{HOSTS[name]}:{self.ports[name]}"


def start(pool: Pool, name: str) -> Daemon:
    d = start_daemon(pool.dirs[name], host=HOSTS[name], port=pool.ports[name], extra_env=pool.envs[name])
    pool.nodes[name] = d
    return d


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    ports = {name: free_port(host) for name, host in HOSTS.items()}
    stores = {"alpha": (), "bravo": ("tiny",), "charlie": ("tiny", "conly")}
    p = Pool({}, {}, {}, ports)
    for name in HOSTS:
        tmp = tmp_path_factory.mktemp(name)
        make_store(tmp, stores[name])
        (tmp / "bin").mkdir()
        others = ", ".join(f"{h}:{ports[n]}" for n, h in HOSTS.items() if n != name)
        p.dirs[name] = tmp
        p.envs[name] = {"LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_DEBUG": "1",
                        "LLMMAN_MEMORY": "4GB", "LLMMAN_NODE_NAME": name, "LLMMAN_PEERS": others,
                        "LLMMAN_NUM_PARALLEL": "2", "FAKE_REPLY": REPLY}
    try:
        for name in HOSTS:
            start(p, name)
        yield p
    finally:
        for d in p.nodes.values():
            for child in d.children():
                child.kill()
            d.stop(signal.SIGKILL if d.process.poll() is None else signal.SIGTERM)


def view(d: Daemon) -> dict[str, dict[str, Any]]:
    """``d``'s ``/llmman/pool``, by node address."""
    r = httpx.get(d.url + "/llmman/pool", timeout=30)
    r.raise_for_status()
    return {n["address"]: n for n in r.json()["nodes"]}


def all_up(pool: Pool, d: Daemon) -> bool:
    nodes = view(d)
    return len(nodes) == 3 and all(n["state"] == "up" and n["last_seen"] is not None for n in nodes.values())


def test_every_node_shows_all_three_and_marks_itself(pool: Pool) -> None:
    for name, d in pool.nodes.items():
        wait_until(functools.partial(all_up, pool, d), f"{name} to see every node up")
        nodes = view(d)
        assert {a: n["name"] for a, n in nodes.items()} == {pool.address(n): n for n in HOSTS}
        assert [n["name"] for n in nodes.values() if n["self"]] == [name]
        assert next(iter(nodes)) == pool.address(name)  # this node first
        for n in nodes.values():
            assert n["memory"] == 4 * 10**9 and n["version"] and n["fallback"] is False
        assert nodes[pool.address("charlie")]["stored"] == 2 and nodes[pool.address("alpha")]["stored"] == 0


def test_a_model_loaded_on_a_peer_appears_in_the_view(pool: Pool) -> None:
    a, b = pool.nodes["alpha"], pool.nodes["bravo"]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    r = httpx.post(b.url + "/api/chat", json=body, headers=HOP, timeout=60)
    assert r.status_code == 200, r.text

    def shows_it_idle() -> bool:  # a refresh may have caught it loading, or the chat still in flight
        load = view(a)[pool.address("bravo")]["models"].get(TINY)
        return load is not None and (load["loading"], load["slots"], load["in_flight"], load["queued"],
                                     load["draining"]) == (False, 2, 0, 0, False)  # fmt: skip

    wait_until(shows_it_idle, "alpha's refresh to see tiny loaded and idle on bravo, with its 2 slots")
    load = view(a)[pool.address("bravo")]["models"][TINY]
    assert load["size"] > 0
    mine = view(b)[pool.address("bravo")]
    assert mine["self"] is True and TINY in mine["models"]


def probe_rounds(d: Daemon) -> int:
    return d.log_text().count("probe round ")


def test_a_cold_request_on_fresh_views_makes_no_probe(pool: Pool) -> None:
    a = pool.nodes["alpha"]
    wait_until(lambda: all_up(pool, a), "alpha to see every node up")
    before, placements = probe_rounds(a), a.log_text().count(f"placement of {CONLY}")
    body = {"model": "conly", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    r = httpx.post(a.url + "/api/chat", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["message"]["content"] == REPLY
    assert a.log_text().count(f"placement of {CONLY}") == placements + 1  # it was decided here, cold
    assert probe_rounds(a) == before, a.log_text()[-3000:]
    assert local_ps(pool.nodes["charlie"]) == [CONLY]  # forwarded to the node storing it
    assert "refresh of peer" not in a.log_text()  # no refresh failed on the way


def test_llmman_nodes_prints_the_pool(pool: Pool) -> None:
    a = pool.nodes["alpha"]
    wait_until(lambda: all_up(pool, a), "alpha to see every node up")
    run = [sys.executable, "-m", "llmman", "nodes"]
    out = subprocess.run(run, env=a.env, capture_output=True, text=True, timeout=60, check=True).stdout
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "ADDRESS", "STATE", "MEMORY", "MODELS", "LAST", "SEEN"]
    assert lines[1].startswith("alpha (this node)") and pool.address("alpha") in lines[1]
    for name in ("bravo", "charlie"):
        [row] = [line for line in lines if line.startswith(name + " ")]
        assert pool.address(name) in row and " up " in row and "/4.0 GB" in row
    doc = json.loads(subprocess.run([*run, "--json"], env=a.env, capture_output=True, text=True, timeout=60,
                                    check=True).stdout)
    assert [n["name"] for n in doc["nodes"]] == ["alpha", "bravo", "charlie"]


def test_a_killed_peer_shows_down_and_comes_back_up(pool: Pool) -> None:
    a, c = pool.nodes["alpha"], pool.nodes["charlie"]
    wait_until(lambda: all_up(pool, a), "alpha to see every node up")
    for child in c.children():
        child.kill()
    c.stop(signal.SIGKILL)
    where = pool.address("charlie")
    wait_until(lambda: view(a)[where]["state"] == "down", "alpha to see charlie down")
    gone = view(a)[where]
    assert gone["why"] and gone["name"] == "charlie" and gone["models"] == {} and gone["memory"] == 0
    start(pool, "charlie")
    wait_until(lambda: view(a)[where]["state"] == "up", "alpha to take charlie back")
    back = view(a)[where]
    assert back["name"] == "charlie" and back["memory"] == 4 * 10**9 and back["last_seen"] < 60
