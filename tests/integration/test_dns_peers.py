"""Peers from DNS against a real DNS server on loopback: Debian's ``dnsmasq`` serving ``llmman.test``.

``pool.llmman.test`` comes from a hosts file dnsmasq re-reads on SIGHUP (``--local-ttl=1``: a TTL of one
second) and ``_llmman._tcp.llmman.test`` is an SRV record whose target is that name. First, the lookups
themselves (``llmman.cluster.discovery.DnsLookup``): A and AAAA with their TTL, SRV, NXDOMAIN as no
address, REFUSED as a failure. Then five real daemons on 127.0.0.2..6, one port, llama-server the fake:
n1..n4 name ``pool.llmman.test``, n5 the SRV name; only n5 stores ``tiny``. The name serves n1..n3, then
n1..n5, then n1..n3 again: n1's ``/llmman/pool`` (and n5's, through SRV) follows without a restart, each
node leaves itself out, a request to n1 for ``tiny`` loaded on n5 is served by n5 while n5 is in the name,
and with dnsmasq gone n1 keeps its last set.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dns.exception
import dns.resolver
import httpx
import pytest

from llmman.cluster.discovery import DnsEntry, DnsLookup, Found, LookupFailed
from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import HOP, Daemon, free_port, local_ps, start_daemon, wait_until

DNSMASQ = shutil.which("dnsmasq") or next((p for p in ("/usr/sbin/dnsmasq", "/sbin/dnsmasq")
                                           if os.access(p, os.X_OK)), None)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.skipif(DNSMASQ is None, reason="needs dnsmasq (Debian's dnsmasq-base)")]

NAME = "pool.llmman.test"
SRV = "_llmman._tcp.llmman.test"
HOSTS = {f"n{i}": f"127.0.0.{i + 1}" for i in range(1, 6)}  # n1 .. n5 on 127.0.0.2 .. 127.0.0.6
TINY = "docker.io/ai/tiny:latest"


@dataclass
class Dnsmasq:
    """A dnsmasq on 127.0.0.1:``port`` answering for ``llmman.test`` alone, its A/AAAA records from
    ``hosts`` (re-read on SIGHUP), an SRV record ``_llmman._tcp.llmman.test`` -> ``pool.llmman.test``."""

    process: subprocess.Popen[bytes]
    port: int
    hosts: Path
    srv_port: int

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.port}"

    def serve(self, addresses: list[str]) -> None:
        """Make ``pool.llmman.test`` resolve to ``addresses``, and wait until dnsmasq answers so."""
        self.hosts.write_text("".join(f"{a} {NAME}\n" for a in addresses))
        self.process.send_signal(signal.SIGHUP)
        wait_until(lambda: sorted(self.ask(NAME)) == sorted(addresses), f"dnsmasq to serve {addresses}", 20)

    def ask(self, name: str) -> list[str]:
        """``name``'s A and AAAA addresses as dnsmasq answers now (none when it does not answer)."""
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port, resolver.lifetime = ["127.0.0.1"], self.port, 2.0
        try:
            return [r.address for t in ("A", "AAAA")
                    for r in resolver.resolve(name, t, raise_on_no_answer=False)]
        except dns.exception.DNSException:
            return []

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def start_dnsmasq(tmp: Path, srv_port: int) -> Dnsmasq:
    """dnsmasq in the foreground on a free port (another try on a fresh port if it could not bind)."""
    hosts = tmp / "hosts"
    hosts.write_text(f"127.0.0.2 {NAME}\n::1 {NAME}\n")
    for _ in range(5):
        port = free_port()
        argv = [str(DNSMASQ), "--no-daemon", "--no-resolv", "--no-hosts", f"--port={port}",
                "--listen-address=127.0.0.1", "--bind-interfaces", f"--addn-hosts={hosts}", "--local-ttl=1",
                "--local=/llmman.test/", f"--srv-host={SRV},{NAME},{srv_port}", "--pid-file=",
                "--log-facility=-"]
        with (tmp / "dnsmasq.log").open("ab") as log:
            process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        d = Dnsmasq(process, port, hosts, srv_port)
        deadline = time.monotonic() + 10
        while process.poll() is None and time.monotonic() < deadline and not d.ask(NAME):
            time.sleep(0.05)  # polling a subprocess's readiness: the event is its first answer
        if d.ask(NAME):
            return d
        d.stop()
    raise RuntimeError(f"dnsmasq did not start: {(tmp / 'dnsmasq.log').read_text()}")


@pytest.fixture(scope="module")
def port() -> int:
    """One port free on all five addresses: the daemons' port and the SRV record's."""
    while True:
        p = free_port("127.0.0.2")
        if all(_bindable(h, p) for h in HOSTS.values()):
            return p


def _bindable(host: str, p: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, p))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def dnsmasq(tmp_path_factory: pytest.TempPathFactory, port: int) -> Iterator[Dnsmasq]:
    d = start_dnsmasq(tmp_path_factory.mktemp("dnsmasq"), port)
    try:
        yield d
    finally:
        d.stop()


# -- the lookups ------------------------------------------------------------------------------------


def test_a_name_is_every_address_with_its_ttl(dnsmasq: Dnsmasq) -> None:
    dnsmasq.serve(["127.0.0.2", "127.0.0.3", "::1"])
    answer = asyncio.run(DnsLookup(dnsmasq.server)(DnsEntry("http", NAME, 9000, False)))
    assert set(answer.found) == {Found(a, 9000, NAME) for a in ("127.0.0.2", "127.0.0.3", "::1")}
    assert len(answer.found) == 3
    assert answer.ttl == 1.0  # dnsmasq's --local-ttl


def test_an_srv_name_is_every_target_at_the_records_port(dnsmasq: Dnsmasq) -> None:
    dnsmasq.serve(["127.0.0.4", "::1"])
    answer = asyncio.run(DnsLookup(dnsmasq.server)(DnsEntry("http", SRV, 17434, True)))
    assert set(answer.found) == {Found(a, dnsmasq.srv_port, NAME) for a in ("127.0.0.4", "::1")}


def test_a_name_that_does_not_exist_is_no_address_and_a_refusal_is_a_failure(dnsmasq: Dnsmasq) -> None:
    lookup = DnsLookup(dnsmasq.server)
    answer = asyncio.run(lookup(DnsEntry("http", "nobody.llmman.test", 1, False)))
    assert answer.found == ()
    with pytest.raises(LookupFailed, match="REFUSED"):  # outside llmman.test dnsmasq has no upstream
        asyncio.run(lookup(DnsEntry("http", "elsewhere.example", 1, False)))


# -- a pool that grows and shrinks ------------------------------------------------------------------


def view(d: Daemon) -> dict[str, dict[str, Any]]:
    """``d``'s ``/llmman/pool``, by node address."""
    r = httpx.get(d.url + "/llmman/pool", timeout=30)
    r.raise_for_status()
    return {n["address"]: n for n in r.json()["nodes"]}


def peers_up(d: Daemon) -> set[str]:
    """The addresses of the peers ``d`` shows, provided every one is up and seen (else an empty set)."""
    nodes = [n for n in view(d).values() if not n["self"]]
    ok = all(n["state"] == "up" and n["last_seen"] is not None for n in nodes)
    return {n["address"] for n in nodes} if ok else set()


def peer_addresses(d: Daemon) -> set[str]:
    return {n["address"] for n in view(d).values() if not n["self"]}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory, dnsmasq: Dnsmasq,
          port: int) -> Iterator[dict[str, Daemon]]:
    dnsmasq.serve([HOSTS[n] for n in ("n1", "n2", "n3")])
    started: dict[str, Daemon] = {}
    try:
        for name, host in HOSTS.items():
            tmp = tmp_path_factory.mktemp(name)
            make_store(tmp, ("tiny",) if name == "n5" else ())
            (tmp / "bin").mkdir()
            entry = SRV if name == "n5" else f"{NAME}:{port}"
            started[name] = start_daemon(tmp, host=host, port=port, extra_env={
                "LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_NODE_NAME": name,
                "LLMMAN_PEERS": entry, "LLMMAN_PEER_DNS": dnsmasq.server, "LLMMAN_MEMORY": "4GB",
                "LLMMAN_NUM_PARALLEL": "2", "FAKE_REPLY": "w0 w1"})
        yield started
    finally:
        for d in started.values():
            for child in d.children():
                child.kill()
            d.stop(signal.SIGKILL if d.process.poll() is None else signal.SIGTERM)


def address(name: str, port: int) -> str:
    return f"{HOSTS[name]}:{port}"


def test_the_pool_follows_the_name_without_a_restart(nodes: dict[str, Daemon], dnsmasq: Dnsmasq,
                                                     port: int) -> None:
    n1, n5 = nodes["n1"], nodes["n5"]
    three = {address(n, port) for n in ("n2", "n3")}
    wait_until(lambda: peers_up(n1) == three, "n1 to see n2 and n3 (and leave itself out)")
    shown = view(n1)
    assert shown[address("n1", port)]["self"] is True
    assert [a for a, n in shown.items() if n["name"] == "n1"] == [address("n1", port)]  # itself once
    body = {"model": "tiny", "prompt": "hi", "stream": False}
    assert httpx.post(n1.url + "/api/generate", json=body, timeout=60).status_code == 404  # no peer stores it
    r = httpx.post(n5.url + "/api/generate", json=body, headers=HOP, timeout=60)  # load it on n5 alone
    assert r.status_code == 200, r.text
    assert local_ps(n5) == [TINY]

    dnsmasq.serve(list(HOSTS.values()))
    five = {address(n, port) for n in ("n2", "n3", "n4", "n5")}
    wait_until(lambda: peers_up(n1) == five, "n1 to see n2..n5 after the name grew")
    wait_until(lambda: peers_up(n5) == {address(n, port) for n in ("n1", "n2", "n3", "n4")},
               "n5 (named by SRV) to see n1..n4 and leave itself out")
    r = httpx.post(n1.url + "/api/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["x-llmman-node"] == "n5" and r.json()["response"] == "w0 w1"
    assert local_ps(n1) == []

    dnsmasq.serve([HOSTS[n] for n in ("n1", "n2", "n3")])
    wait_until(lambda: peer_addresses(n1) == three, "n1 to drop n4 and n5 after the name shrank")
    cli = subprocess.run([sys.executable, "-m", "llmman", "nodes", "--json"], capture_output=True, text=True,
                         env={**n1.env, "LLMMAN_HOST": f"{HOSTS['n1']}:{port}"}, timeout=60, check=True)
    assert {n["address"] for n in json.loads(cli.stdout)["nodes"]} == {address("n1", port), *three}
    assert "removed " in n1.log_text()

    dnsmasq.stop()  # lookups fail now: the last set is kept, and that is logged once
    wait_until(lambda: f"looking up {NAME}:{port} failed" in n1.log_text(), "n1 to log the failed lookup")
    assert peer_addresses(n1) == three
    assert n1.log_text().count(f"looking up {NAME}:{port} failed") == 1
