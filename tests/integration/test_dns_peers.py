"""Peers from DNS against a real DNS server on loopback: Debian's ``dnsmasq`` serving ``llmman.test``.

``pool.llmman.test`` comes from a hosts file dnsmasq re-reads on SIGHUP (``--local-ttl=1``: a TTL of one
second) and ``_llmman._tcp.llmman.test`` is an SRV record whose target is that name. First, the lookups
themselves (``llmman.cluster.discovery.DnsLookup``): A and AAAA with their TTL, SRV, NXDOMAIN as no
address, REFUSED as a failure. Then five real daemons on 127.0.0.2..6, one port, llama-server the fake:
n1..n4 name ``pool.llmman.test``, n5 the SRV name; only n5 stores ``tiny``. The name serves n1..n3, then
n1..n5, then n1..n3 again: n1's ``/llmman/pool`` (and n5's, through SRV) follows without a restart, each
node leaves itself out, a request to n1 for ``tiny`` loaded on n5 is served by n5 while n5 is in the name,
and with dnsmasq gone n1 keeps its last set. Between the two, an ``https://`` name: a node bound to
``https://0.0.0.0`` whose certificate names ``secure.llmman.test`` (and 127.0.0.1) but not 127.0.0.9, the
address the name gives, is up in another node's pool and serves its forwards (verified as the name), and
leaves itself out of its own pool (127.0.0.9 on its port is this machine).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
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
    names: dict[str, list[str]] = field(default_factory=dict)  # what the hosts file says now

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.port}"

    def serve(self, addresses: list[str], name: str = NAME) -> None:
        """Make ``name`` resolve to ``addresses``, and wait until dnsmasq answers so."""
        self.names[name] = addresses
        self.hosts.write_text("".join(f"{a} {n}\n" for n, found in self.names.items() for a in found))
        self.process.send_signal(signal.SIGHUP)
        wait_until(lambda: sorted(self.ask(name)) == sorted(addresses), f"dnsmasq to serve {addresses}", 20)

    def ask(self, name: str) -> list[str]:
        """``name``'s A and AAAA addresses as dnsmasq answers now (none when it does not answer)."""
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port, resolver.lifetime = ["127.0.0.1"], self.port, 2.0
        found: list[str] = []
        for rdtype in ("A", "AAAA"):
            try:
                found += [r.address for r in resolver.resolve(name, rdtype, raise_on_no_answer=False)]
            except dns.exception.DNSException:
                continue
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def start_dnsmasq(tmp: Path, srv_port: int, *, local: bool = True) -> Dnsmasq:
    """dnsmasq in the foreground on a free port (another try on a fresh port if it could not bind).
    Without ``local`` it is not authoritative for ``llmman.test``: it answers the A records of its hosts
    file but refuses AAAA (it has no upstream to ask), as a user's plain dnsmasq line does."""
    hosts = tmp / "hosts"
    hosts.write_text(f"127.0.0.2 {NAME}\n::1 {NAME}\n")
    for _ in range(5):
        port = free_port()
        argv = [str(DNSMASQ), "--no-daemon", "--no-resolv", "--no-hosts", f"--port={port}",
                "--listen-address=127.0.0.1", "--bind-interfaces", f"--addn-hosts={hosts}", "--local-ttl=1",
                *(["--local=/llmman.test/"] if local else []), f"--srv-host={SRV},{NAME},{srv_port}",
                "--pid-file=",
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


def test_a_server_that_refuses_aaaa_still_gives_the_a_records(tmp_path: Path) -> None:
    """dnsmasq without ``--local`` answers A from its hosts file and REFUSED for AAAA: the IPv4 peers stay."""
    d = start_dnsmasq(tmp_path, 9, local=False)
    try:
        d.hosts.write_text(f"127.0.0.2 {NAME}\n127.0.0.3 {NAME}\n")
        d.process.send_signal(signal.SIGHUP)
        wait_until(lambda: sorted(d.ask(NAME)) == ["127.0.0.2", "127.0.0.3"], "dnsmasq to serve two", 20)
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port = ["127.0.0.1"], d.port
        with pytest.raises(dns.resolver.NoNameservers, match="REFUSED"):  # the condition under test
            resolver.resolve(NAME, "AAAA")
        answer = asyncio.run(DnsLookup(d.server)(DnsEntry("http", NAME, 9000, False)))
        assert sorted(f.host for f in answer.found) == ["127.0.0.2", "127.0.0.3"]
    finally:
        d.stop()


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


SECURE = "secure.llmman.test"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for ``secure.llmman.test`` and 127.0.0.1 only (not 127.0.0.9): ca, cert, key."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
             "-subj", "/CN=llmman test CA", "-keyout", "ca.key", "-out", "ca.pem", cwd=tmp)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=secure",
             "-keyout", "node.key", "-out", "node.csr", cwd=tmp)
    (tmp / "ext.cnf").write_text(f"subjectAltName=DNS:{SECURE},IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", "ext.cnf", "-out", "node.pem", cwd=tmp)
    return tmp / "ca.pem", tmp / "node.pem", tmp / "node.key"


def start_wildcard_tls(tmp: Path, port: int, env: dict[str, str], ca: Path) -> Daemon:
    """A daemon on ``https://0.0.0.0:port`` (daemons.start_daemon would check it at 0.0.0.0, which its
    certificate does not name): ready once ``https://127.0.0.1:port`` answers."""
    home = tmp / "home"
    home.mkdir()
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_"))}
    full.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
                XDG_DATA_HOME=str(home / ".local" / "share"), LLMMAN_HOST=f"https://0.0.0.0:{port}",
                LLMMAN_MODELS=str(tmp / "store"), LLMMAN_OFFLINE="1", PYTHONUNBUFFERED="1", **env)
    log = tmp / "daemon.log"
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "llmman", "serve"], env=full, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp)
    d = Daemon(process=process, url=f"https://127.0.0.1:{port}", home=home, store=tmp / "store", log=log,
               env=full)
    verify = ssl.create_default_context(cafile=str(ca))

    def ready() -> bool:
        assert process.poll() is None, d.log_text()
        try:
            return httpx.get(d.url + "/api/version", verify=verify, timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(ready, "the TLS daemon to answer")
    return d


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_an_https_name_is_verified_as_the_name_at_each_address(tmp_path: Path, dnsmasq: Dnsmasq) -> None:
    ca, cert, key = make_pki(tmp_path)
    dnsmasq.serve(["127.0.0.9"], SECURE)  # where the wildcard-bound node answers too; its certificate
    port = free_port("0.0.0.0")           # does not name that address, only the name
    secure_tmp, front_tmp = tmp_path / "secure", tmp_path / "front"
    make_store(secure_tmp, ("tiny",))
    make_store(front_tmp, ())
    (secure_tmp / "bin").mkdir()
    entry = f"https://{SECURE}:{port}"
    secure = start_wildcard_tls(secure_tmp, port, {
        "LLMMAN_LLAMA_SERVER": str(make_fake_binary(secure_tmp / "bin")), "LLMMAN_NODE_NAME": "secure",
        "LLMMAN_TLS_CERT": str(cert), "LLMMAN_TLS_KEY": str(key), "LLMMAN_TLS_CA": str(ca),
        "LLMMAN_API_KEYS": "pool-key", "LLMMAN_PEERS": entry, "LLMMAN_PEER_DNS": dnsmasq.server,
        "FAKE_REPLY": "w0 w1"}, ca)
    try:
        front = start_daemon(front_tmp, host="127.0.0.10", extra_env={
            "LLMMAN_PEERS": entry, "LLMMAN_PEER_DNS": dnsmasq.server, "LLMMAN_TLS_CA": str(ca),
            "LLMMAN_PEER_API_KEY": "pool-key", "LLMMAN_NODE_NAME": "front"})
        try:
            at = f"127.0.0.9:{port}"
            wait_until(lambda: peers_up(front) == {at}, "front to see the https peer up at 127.0.0.9")
            assert view(front)[at]["name"] == "secure"  # its certificate verified against the name
            body = {"model": "tiny", "prompt": "hi", "stream": False}
            r = httpx.post(front.url + "/api/generate", json=body, timeout=60)
            assert r.status_code == 200, r.text
            assert r.headers["x-llmman-node"] == "secure"
            mine = httpx.get(secure.url + "/llmman/pool", headers={"Authorization": "Bearer pool-key"},
                             verify=ssl.create_default_context(cafile=str(ca)), timeout=30).json()["nodes"]
            assert [n["self"] for n in mine] == [True]  # 127.0.0.9 on its port, bound to 0.0.0.0: itself
        finally:
            front.stop()
    finally:
        for child in secure.children():
            child.kill()
        secure.stop()


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
