"""Session 7's attack findings on real daemons, each a test that failed before its fix (brief s7/a_attack).

- A peer could have a lending node start any number of ``ggml-rpc-server`` workers: one byte reserved each,
  each a process with a thread per CPU (40 such leases: 40 processes, 216 MiB resident for 40 bytes
  reserved). A node now lends at most llmman.sched.lending.MAX_WORKERS at once (503
  ``rpc_workers_exhausted`` past that), counted with the leases still starting.
- With ``rpc.ports``, concurrent leases took the same port (a starting worker held none yet): the second
  worker failed to bind, passed as ready on the first one's port, and two peers shared one worker.
- The same between two daemons on one host sharing ``rpc.ports``: a worker is ready only once its own
  process listens on its port (llmman.runner.rpc_worker), not when another's server accepts there; and
  the lender whose worker lost the port tries the next one of ``rpc.ports`` instead of answering 500.
- A worker stopped under a split's stream (SIGSTOP) kept its lease: its daemon renewed it,
  the owner's llama-server waited on it for ever and the stream hung with no byte and no error (200 s
  measured before the client gave up). Its renewal now answers 404 and the stream ends with the dialect's
  in-band error; the whole lender stopped (daemon and worker) already ended it within a lease.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from llmman.sched.lending import MAX_WORKERS
from tests.integration.daemons import Daemon, free_port, wait_until
from tests.integration.test_rpc_workers import WORKERS, lend, lending_daemon, node, rpc_children, worker_pid
from tests.integration.test_split import GEMMA, GEMMA_REF, Pool, ask, gemma, pool, ps  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(300)]


def free_range(count: int) -> int:
    """The first of ``count`` consecutive loopback ports that all bind now."""
    for _ in range(100):
        first = free_port()
        if first + count <= 65535 and all(_bindable(p) for p in range(first, first + count)):
            return first
    raise AssertionError(f"no {count} consecutive free ports")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def lender(tmp_path: Path, model_file: Path) -> Iterator[Daemon]:
    d = lending_daemon(tmp_path, model_file)
    try:
        yield d
    finally:
        d.stop()


def test_a_node_lends_a_bounded_number_of_workers_even_to_concurrent_leases(lender: Daemon) -> None:
    extra = 6
    with concurrent.futures.ThreadPoolExecutor(8) as executor:
        answers = list(executor.map(lambda i: lend(lender, 1, owner=f"peer-{i}"), range(MAX_WORKERS + extra)))
    lent = [r.json()["id"] for r in answers if r.status_code == 201]
    refused = [r for r in answers if r.status_code != 201]
    assert len(lent) == MAX_WORKERS, [r.text for r in refused]
    assert len(refused) == extra
    assert all(r.status_code == 503 and f"at most {MAX_WORKERS} RPC workers" in r.text
               for r in refused), [r.text for r in refused]
    assert len(rpc_children(lender)) == MAX_WORKERS
    assert node(lender)["rpc"] == {"serve": True, "reserved": MAX_WORKERS, "workers": MAX_WORKERS}

    gone = lent.pop()
    assert httpx.delete(f"{lender.url}{WORKERS}/{gone}", timeout=30).json() == {"stopped": True}
    again = lend(lender, 1)
    assert again.status_code == 201, again.text  # the slot came back with the worker
    lent.append(again.json()["id"])

    for worker_id in lent:
        assert httpx.delete(f"{lender.url}{WORKERS}/{worker_id}", timeout=30).json() == {"stopped": True}
    assert node(lender)["rpc"] == {"serve": True, "reserved": 0, "workers": 0}
    wait_until(lambda: not rpc_children(lender), "every worker reaped")


def test_concurrent_leases_on_rpc_ports_get_a_port_each(tmp_path: Path, model_file: Path) -> None:
    """With ``rpc.ports``, leases made at once each get their own port: a worker still starting held none,
    so two took the same one, the second was taken as ready because the first one's port accepted (two
    peers' llama-servers then share one ggml-rpc-server) and a ghost held its reservation."""
    count = 4
    first = free_range(count)
    d = lending_daemon(tmp_path, model_file, LLMMAN_RPC_PORTS=f"{first}-{first + count - 1}")
    try:
        with concurrent.futures.ThreadPoolExecutor(count) as executor:
            answers = list(executor.map(lambda i: lend(d, 1 << 20, owner=f"peer-{i}"), range(count)))
        assert all(r.status_code == 201 for r in answers), [r.text for r in answers]
        endpoints = sorted(r.json()["endpoint"] for r in answers)
        assert endpoints == [f"127.0.0.1:{p}" for p in range(first, first + count)]
        assert len(rpc_children(d)) == count
    finally:
        d.stop()


def test_two_lenders_on_one_host_sharing_rpc_ports_never_hand_out_each_others_workers(
        tmp_path: Path, model_file: Path) -> None:
    """Two daemons on one host with the same ``rpc.ports`` both find a port free and start a worker on it
    at once; one binds it. The other's worker failed to, yet its port accepted (the first one's server):
    it was answered 201 with an endpoint that was another node's worker (5 rounds in 8 before the fix).
    Each 201 must name a worker of the daemon that answered it; and the one that lost the port takes the
    next of the range rather than failing (it answered 500 ``exited with code 0 while starting``)."""
    first = free_range(2)
    ports = f"{first}-{first + 1}"
    a = lending_daemon(tmp_path / "a", model_file, LLMMAN_RPC_PORTS=ports)
    b = lending_daemon(tmp_path / "b", model_file, LLMMAN_RPC_PORTS=ports)
    barrier = threading.Barrier(2)  # the two leases of a round at once (a barrier resets after each)

    def both(d: Daemon) -> tuple[Daemon, httpx.Response]:
        barrier.wait()
        return d, lend(d, 1 << 20)

    try:
        for _ in range(8):
            with concurrent.futures.ThreadPoolExecutor(2) as executor:
                answers = list(executor.map(both, (a, b)))
            for d, r in answers:
                assert r.status_code == 201, r.text
                port = int(r.json()["endpoint"].rsplit(":", 1)[1])
                assert worker_pid(port) in {k.pid for k in rpc_children(d)}, "another node's worker"
            for d, r in answers:
                httpx.delete(f"{d.url}{WORKERS}/{r.json()['id']}", timeout=30).raise_for_status()
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("what", ["worker", "lender"])
def test_a_stopped_worker_or_lender_ends_the_split_stream_with_an_error(pool: Pool, what: str) -> None:  # noqa: F811
    """SIGSTOP under a split's stream, of the worker alone or of its whole lender (daemon and worker): the
    stream ends with Ollama's in-band error (the client's 60 s read timeout is the bound: without the fix
    the worker case sent nothing more, ever), the split is gone and its memory back on every lender."""
    assert ask(pool.alpha, "/api/chat")
    body = {"model": GEMMA, "prompt": "Count from 1 to 1000: 1, 2, 3,", "raw": True,
            "options": {"num_predict": 3000, "temperature": 0}}
    lines: list[dict[str, Any]] = []
    frozen: list[psutil.Process] = []
    try:
        with httpx.stream("POST", pool.alpha.url + "/api/generate", json=body,
                          timeout=httpx.Timeout(30, read=60)) as r:
            assert r.status_code == 200
            for raw in r.iter_lines():
                if not raw:
                    continue
                lines.append(json.loads(raw))
                if len(lines) == 3:  # tokens are flowing
                    frozen = rpc_children(pool.bravo)
                    if what == "lender":
                        frozen.insert(0, psutil.Process(pool.bravo.process.pid))
                    for p in frozen:
                        p.send_signal(signal.SIGSTOP)
        assert frozen and len(lines) > 3
        assert "error" in lines[-1] and not lines[-1].get("done"), lines[-1]
    finally:
        for p in frozen:
            p.send_signal(signal.SIGCONT)
    wait_until(lambda: not [m for m in ps(pool.alpha) if m["name"] == GEMMA_REF], "the split to end")
    for lender in (pool.bravo, pool.charlie):
        wait_until(lambda d=lender: node(d)["rpc"]["reserved"] == 0, "the lenders' memory back")
    wait_until(lambda: pool.rpc_workers() == 0, "every worker reaped")
