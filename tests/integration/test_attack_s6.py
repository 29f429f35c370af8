"""Session 6's attack on its own work, against real parts: Debian's ``dnsmasq`` on loopback (as
tests/integration/test_dns_peers.py runs it) serving an SRV record whose port is 0 (no service: no peer)
and a name of 200 addresses (more than a UDP answer holds: the lookup goes on over TCP and finds them all);
a real daemon whose ``NOTIFY_SOCKET`` is a directory and whose ``WATCHDOG_USEC`` is 1 starts, serves and
says the watchdog cannot be met, and one whose DNS server never answers serves at once; ``llmman serve`` in
an environment whose server extra is there but broken (aiohttp without its ``yarl``: this venv's
site-packages less that one package, on the bare interpreter) says so in one line. Last, a peer the name
stops naming in the middle of a streamed answer it is giving through another node (two real daemons, the
fake llama-server streaming slowly): the answer finishes whole, and the next request for that model,
stored nowhere else now, is a clean 404. And a node the name gives at two addresses (a node bound to
``0.0.0.0`` on a machine of two addresses; a dual-stack Service's IPv4 and IPv6 address of one pod) is one
node of the pool, not two.
"""

from __future__ import annotations

import asyncio
import json
import os
import site
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmman.cluster.discovery import DnsEntry, DnsLookup
from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import REPO, free_port, start_daemon, wait_until
from tests.integration.test_dns_peers import (
    DNSMASQ,
    NAME,
    SRV,
    Dnsmasq,
    peer_addresses,
    peers_up,
    start_dnsmasq,
    view,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.skipif(DNSMASQ is None, reason="needs dnsmasq (Debian's dnsmasq-base)")]

BIG = "big.llmman.test"


@pytest.fixture(scope="module")
def dnsmasq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dnsmasq]:
    d = start_dnsmasq(tmp_path_factory.mktemp("dnsmasq"), srv_port=0)  # SRV -> pool.llmman.test, port 0
    try:
        d.serve(["127.0.0.2"])
        yield d
    finally:
        d.stop()


def test_an_srv_record_of_port_0_is_no_peer(dnsmasq: Dnsmasq) -> None:
    answer = asyncio.run(DnsLookup(dnsmasq.server)(DnsEntry("http", SRV, 17434, True)))
    assert answer.found == ()  # not 127.0.0.2:0, a peer no one can reach
    plain = asyncio.run(DnsLookup(dnsmasq.server)(DnsEntry("http", NAME, 17434, False)))
    assert [f.host for f in plain.found] == ["127.0.0.2"]  # the target itself resolves


def test_a_name_of_200_addresses_is_200_peers(dnsmasq: Dnsmasq) -> None:
    hosts = [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in range(200)]
    dnsmasq.serve(hosts, name=BIG)
    answer = asyncio.run(DnsLookup(dnsmasq.server)(DnsEntry("http", BIG, 17434, False)))
    assert sorted(f.host for f in answer.found) == sorted(hosts)


def test_a_daemon_with_a_bad_notify_socket_and_a_1us_watchdog_serves(tmp_path: Path) -> None:
    (tmp_path / "notify").mkdir()
    d = start_daemon(tmp_path, extra_env={"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "1",
                                          "WATCHDOG_PID": "1"})  # WATCHDOG_PID: init's, not the daemon's
    try:
        assert httpx.get(d.url + "/health", timeout=30).status_code == 200
    finally:
        d.stop()
    d2 = start_daemon(tmp_path / "two", extra_env={"NOTIFY_SOCKET": str(tmp_path / "notify"),
                                                   "WATCHDOG_USEC": "1"})
    try:
        assert httpx.get(d2.url + "/health", timeout=30).status_code == 200
        wait_until(lambda: "is shorter than llmman pings" in d2.log_text(), "the watchdog warning")
    finally:
        assert d2.stop() == 0
    assert "shorter than llmman pings" not in d.log_text()  # the watchdog was another process's


def test_a_dns_server_that_never_answers_does_not_hold_up_the_daemon(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as hole:
        hole.bind(("127.0.0.1", 0))  # receives every query, answers none
        d = start_daemon(tmp_path, extra_env={"LLMMAN_PEERS": f"a.llmman.test,{SRV}",
                                              "LLMMAN_PEER_DNS": f"127.0.0.1:{hole.getsockname()[1]}"})
        try:
            with d.client(timeout=30) as client:
                assert client.get("/api/tags").json() == {"models": []}
                nodes = client.get("/llmman/pool").json()["nodes"]
                assert [n["self"] for n in nodes] == [True]
            wait_until(lambda: "looking up a.llmman.test:17434 failed" in d.log_text(), "the failed lookup")
        finally:
            d.stop()


def test_serve_with_a_broken_server_extra_says_so_in_one_line(tmp_path: Path) -> None:
    packages = Path(next(p for p in site.getsitepackages() if p.startswith(sys.prefix)))
    assert (packages / "yarl").is_dir() and (packages / "aiohttp").is_dir()
    less = tmp_path / "site-packages"  # every package of this venv but yarl, which aiohttp imports
    less.mkdir()
    for entry in packages.iterdir():
        if entry.name != "yarl" and not entry.name.startswith("yarl-"):
            (less / entry.name).symlink_to(entry)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LLMMAN_MODELS": str(tmp_path / "store"),
           "PYTHONPATH": os.pathsep.join((str(less), str(REPO / "src")))}
    done = subprocess.run([os.path.realpath(sys.executable), "-s", "-m", "llmman", "serve"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("Error: llmman serve cannot load llmman's server extra, which is installed "
                                  "but broken (No module named 'yarl'); reinstall it with: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_a_peer_removed_mid_answer_finishes_it(tmp_path: Path, dnsmasq: Dnsmasq) -> None:
    port = free_port("127.0.0.2")
    dnsmasq.serve(["127.0.0.2", "127.0.0.3"])
    started = []
    try:
        for name, host in (("n1", "127.0.0.2"), ("n2", "127.0.0.3")):
            tmp = tmp_path / name
            (tmp / "bin").mkdir(parents=True)
            make_store(tmp, ("tiny",) if name == "n2" else ())
            started.append(start_daemon(tmp, host=host, port=port, extra_env={
                "LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_NODE_NAME": name,
                "LLMMAN_PEERS": f"{NAME}:{port}", "LLMMAN_PEER_DNS": dnsmasq.server, "LLMMAN_MEMORY": "4GB",
                "FAKE_REPLY": " ".join(f"w{i}" for i in range(300)), "FAKE_TOKEN_DELAY": "0.05"}))
        n1 = started[0]
        wait_until(lambda: peers_up(n1) == {f"127.0.0.3:{port}"}, "n1 to see n2")
        body = {"model": "tiny", "prompt": "hi", "stream": True}
        words: list[str] = []
        with httpx.stream("POST", n1.url + "/api/generate", json=body, timeout=60) as answer:
            assert answer.status_code == 200 and answer.headers["x-llmman-node"] == "n2"
            lines = answer.iter_lines()
            words.append(json.loads(next(lines))["response"])
            dnsmasq.serve(["127.0.0.2"])  # n2 leaves the name while it answers
            wait_until(lambda: peer_addresses(n1) == set(), "n1 to drop n2")
            at_removal = len(words)
            events = [json.loads(line) for line in lines if line]
        words += [e.get("response", "") for e in events]
        assert events[-1]["done"] is True, events[-1]
        assert "".join(words).split() == [f"w{i}" for i in range(300)]  # whole, nothing lost or doubled
        assert len(events) > at_removal  # it was still streaming when n2 was dropped
        r = httpx.post(n1.url + "/api/generate", json={**body, "stream": False}, timeout=60)
        assert r.status_code == 404, r.text  # stored nowhere n1 knows now
    finally:
        for d in started:
            d.stop()


def test_a_node_at_two_addresses_of_the_name_is_one_node(tmp_path: Path, dnsmasq: Dnsmasq) -> None:
    port = free_port()
    dnsmasq.serve(["127.0.0.2", "127.0.0.3"])  # both are the one node below, bound to every address
    started = []
    try:
        for name, env in (("n2", {"LLMMAN_AUTH": "off"}), ("n1", {"LLMMAN_PEERS": f"{NAME}:{port}",
                                                                  "LLMMAN_PEER_DNS": dnsmasq.server})):
            tmp = tmp_path / name
            (tmp / "bin").mkdir(parents=True)
            started.append(start_daemon(tmp, host="0.0.0.0" if name == "n2" else "127.0.0.1",
                                        port=port if name == "n2" else None, extra_env={
                "LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_NODE_NAME": name,
                "LLMMAN_MEMORY": "4GB", **env}))
        n1 = started[1]
        wait_until(lambda: any(n["name"] == "n2" and n["state"] == "up" for n in view(n1).values()),
                   "n1 to see n2")
        wait_until(lambda: all(n["last_seen"] is not None for n in view(n1).values()), "n1 to probe both")
        assert [n["name"] for n in view(n1).values() if not n["self"]] == ["n2"], view(n1)
    finally:
        for d in started:
            d.stop()
