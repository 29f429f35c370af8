"""Session 6's attack on its own work, against real parts: Debian's ``dnsmasq`` on loopback (as
tests/integration/test_dns_peers.py runs it) serving an SRV record whose port is 0 (no service: no peer)
and a name of 200 addresses (more than a UDP answer holds: the lookup goes on over TCP and finds them all);
a real daemon whose ``NOTIFY_SOCKET`` is a directory and whose ``WATCHDOG_USEC`` is 1 starts, serves and
says the watchdog cannot be met, and one whose DNS server never answers serves at once; ``llmman serve`` in
an environment whose server extra is there but broken (aiohttp without its ``yarl``: this venv's
site-packages less that one package, on the bare interpreter) says so in one line.
"""

from __future__ import annotations

import asyncio
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
from tests.integration.daemons import REPO, start_daemon, wait_until
from tests.integration.test_dns_peers import DNSMASQ, NAME, SRV, Dnsmasq, start_dnsmasq

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
