"""The pool forms from the manifests' own settings, through DNS answering as a cluster's DNS answers for
the headless Service.

A real DNS server on loopback (Debian's ``dnsmasq``) plays CoreDNS for ``llmman-peers``: one SRV record
``_llmman._tcp.llmman-peers.llmman.svc.cluster.local`` per ready pod, each target a per-pod name
(``127-0-0-2.llmman-peers.llmman.svc.cluster.local``) with its A record. Three real daemons play the pods,
each on its own address (127.0.0.2..4) and one port, as pods have one IP each and the same container port.
They get the pod's environment from deploy/kubernetes/ (settings.env: ``LLMMAN_PEERS`` as it is; the keys
of keys.env.example), and only what a pod gets from the cluster differs: the address they listen on, the
DNS server (``LLMMAN_PEER_DNS``), the store, the node name. Every node must list the two others up (so the
pool key each presents is one the others accept) and itself once.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.exception
import dns.resolver
import httpx
import pytest

from tests.integration.daemons import Daemon, free_port, start_daemon, wait_until
from tests.kube_manifests import pod_env

DNSMASQ = shutil.which("dnsmasq") or next((p for p in ("/usr/sbin/dnsmasq", "/sbin/dnsmasq")
                                           if os.access(p, os.X_OK)), None)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.skipif(DNSMASQ is None, reason="needs dnsmasq (Debian's dnsmasq-base)")]

PODS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
SERVICE = "llmman-peers.llmman.svc.cluster.local"


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _target(address: str) -> str:
    """CoreDNS's name for a headless Service's endpoint without a hostname: its address, dashed."""
    return f"{address.replace('.', '-')}.{SERVICE}"


def _srv(dns_port: int, name: str) -> list[tuple[str, int]]:
    """``name``'s SRV records (target, port) as the server answers now."""
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers, resolver.port, resolver.lifetime = ["127.0.0.1"], dns_port, 2.0
    try:
        return [(str(r.target).rstrip("."), r.port) for r in resolver.resolve(name, "SRV")]
    except dns.exception.DNSException:
        return []


@pytest.fixture
def cluster_dns(tmp_path: Path) -> Iterator[tuple[int, int, str]]:
    """dnsmasq answering for cluster.local as CoreDNS would for three ready pods: (DNS port, pod port,
    the SRV name that settings.env names)."""
    peers = pod_env()["LLMMAN_PEERS"]
    assert peers.startswith("_") and peers.endswith(SERVICE), peers
    ports = iter(lambda: free_port("127.0.0.2"), None)
    pod_port = next(p for p in ports if all(_bindable(h, p) for h in PODS))  # one port on every pod address
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"{a} {_target(a)}\n{a} {SERVICE}\n" for a in PODS))
    for _ in range(5):
        dns_port = free_port()
        argv = [str(DNSMASQ), "--no-daemon", "--no-resolv", "--no-hosts", f"--port={dns_port}",
                "--listen-address=127.0.0.1", "--bind-interfaces", f"--addn-hosts={hosts}", "--local-ttl=5",
                "--local=/cluster.local/", "--pid-file=", "--log-facility=-",
                *(f"--srv-host={peers},{_target(a)},{pod_port}" for a in PODS)]
        with (tmp_path / "dnsmasq.log").open("ab") as log:
            process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        deadline, full = time.monotonic() + 10, len(PODS)
        while process.poll() is None and time.monotonic() < deadline and len(_srv(dns_port, peers)) < full:
            time.sleep(0.05)  # polling a subprocess's readiness: the event is its first full answer
        if len(_srv(dns_port, peers)) == len(PODS):
            try:
                yield dns_port, pod_port, peers
            finally:
                process.terminate()
                process.wait(timeout=10)
            return
        process.kill()
        process.wait(timeout=10)
    raise RuntimeError(f"dnsmasq did not start: {(tmp_path / 'dnsmasq.log').read_text()}")


def _pool(node: Daemon, key: str) -> list[dict[str, Any]]:
    answer = httpx.get(node.url + "/llmman/pool", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    answer.raise_for_status()
    nodes = answer.json()["nodes"]
    assert isinstance(nodes, list)
    return nodes


def test_the_pods_form_one_pool_through_the_headless_services_srv_name(
        tmp_path: Path, cluster_dns: tuple[int, int, str]) -> None:
    dns_port, pod_port, _peers = cluster_dns
    env = {k: v for k, v in pod_env().items() if k not in ("LLMMAN_HOST", "LLMMAN_MODELS")}
    client_key = env["LLMMAN_API_KEYS"].split(",")[0]
    nodes: list[Daemon] = []
    try:
        for i, address in enumerate(PODS):
            extra = {**env, "LLMMAN_PEER_DNS": f"127.0.0.1:{dns_port}", "LLMMAN_NODE_NAME": f"node-{i}"}
            nodes.append(start_daemon(tmp_path / f"pod{i}", host=address, port=pod_port, extra_env=extra))

        def formed() -> bool:
            for node, address in zip(nodes, PODS, strict=True):
                pool = _pool(node, client_key)
                mine = [n for n in pool if n.get("self")]
                others = {n["address"]: n["state"] for n in pool if not n.get("self")}
                expected = {f"{a}:{pod_port}": "up" for a in PODS if a != address}
                if len(mine) != 1 or others != expected:
                    return False
            return True

        wait_until(formed, "every pod to list the two others up and itself once", timeout=60)
        names = {n["name"] for n in _pool(nodes[0], client_key)}
        assert names == {"node-0", "node-1", "node-2"}  # LLMMAN_NODE_NAME, as spec.nodeName gives it
    finally:
        for node in nodes:
            node.stop()
