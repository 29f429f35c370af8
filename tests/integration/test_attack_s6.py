"""Session 6's attack on its own work, against real parts: Debian's ``dnsmasq`` on loopback (as
tests/integration/test_dns_peers.py runs it) serving an SRV record whose port is 0 (no service: no peer)
and a name of 200 addresses (more than a UDP answer holds: the lookup goes on over TCP and finds them all);
a real daemon whose ``NOTIFY_SOCKET`` is a directory and whose ``WATCHDOG_USEC`` is 1 starts, serves and
says the watchdog cannot be met, and one whose DNS server never answers serves at once.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmman.cluster.discovery import DnsEntry, DnsLookup
from tests.integration.daemons import start_daemon, wait_until
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
