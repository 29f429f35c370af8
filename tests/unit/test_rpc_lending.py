"""The lending table (llmman.sched.lending.Lending) over a real scheduler and real ``ggml-rpc-server``
workers: leases renewed and expired, stops, a worker that dies by itself, the memory reservation in the
scheduler's admission (it blocks a load that would not fit, evicts idle models, never busy ones, and 507s
when it cannot be had), ``rpc.serve`` off, and shutdown. The models are stub children (tests/fakes/runner.py):
only admission is under test there."""

from __future__ import annotations

import asyncio
import math
import os
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from tests.fakes.runner import StubRunner
from tests.unit.test_rpc_worker import gone, rpc_binary

from llmman.errors import LlmmanError
from llmman.sched.lending import Lending, LendingOptions, RpcDisabled, WorkerGone, addresses, prune_logs
from llmman.sched.scheduler import ModelPlan, Runner, Scheduler


class Launcher:
    """Starts stub children; ``started`` lists them."""

    def __init__(self) -> None:
        self.started: list[StubRunner] = []

    async def __call__(self, plan: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        runner = StubRunner(f"http://127.0.0.1:{9000 + len(self.started)}", 1000 + len(self.started), on_exit)
        self.started.append(runner)
        return runner


def plan(name: str, estimate: int) -> ModelPlan:
    return ModelPlan(reference=f"docker.io/ai/{name}:1", digest="sha256:" + "0" * 64, size=estimate,
                     n_ctx=2048, estimate=estimate)


async def until(condition: Callable[[], bool], what: str, within: float = 20.0) -> None:
    """Poll ``condition`` (the event loop runs meanwhile) until it holds; fail naming ``what``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def options(tmp_path: Path, *, serve: bool = True, lease: float = 30.0,
            ports: tuple[int, int] | None = None) -> LendingOptions:
    return LendingOptions(serve=serve, lease=lease, bind="127.0.0.1", cache=True,
                          cache_dir=tmp_path / "rpc-cache", logs_dir=tmp_path / "logs", threads=1,
                          ports=ports)


class Node:
    """A scheduler with ``capacity`` bytes and its lending table."""

    def __init__(self, tmp_path: Path, capacity: int = 1000, **kwargs: object) -> None:
        self.launcher = Launcher()
        self.scheduler = Scheduler(self.launcher, default_keep_alive=300, capacity=capacity)
        binary = rpc_binary()
        self.lending = Lending(self.scheduler, options(tmp_path, **kwargs),  # type: ignore[arg-type]
                               find_binary=lambda: binary, environ={"PATH": os.environ.get("PATH", "")})

    async def close(self) -> None:
        await self.lending.close()
        await self.scheduler.close()


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    n = Node(tmp_path)
    yield n
    await n.close()


async def test_lend_renew_stop(node: Node) -> None:
    lent = await node.lending.lend("owner-1", "docker.io/ai/big:1", 400)
    assert lent.worker.alive and lent.endpoint == f"127.0.0.1:{lent.worker.port}"
    assert node.scheduler.reserved == 400 and node.scheduler.reservations == 1 and node.scheduler.lends
    (row,) = node.lending.listing()
    assert row["id"] == lent.id and row["owner"] == "owner-1" and row["model"] == "docker.io/ai/big:1"
    assert row["memory"] == 400 and row["alive"] is True and 0 < row["expires_in"] <= 30
    assert node.lending.renew(lent.id) == 30.0
    pid = lent.worker.pid
    assert pid is not None
    assert await node.lending.stop(lent.id) is True
    assert gone(pid) and node.scheduler.reserved == 0 and node.scheduler.reservations == 0
    assert await node.lending.stop(lent.id) is False
    with pytest.raises(WorkerGone) as caught:
        node.lending.renew(lent.id)
    assert caught.value.status == 404 and caught.value.code == "worker_gone"
    assert node.lending.listing() == []


async def test_a_lease_not_renewed_expires(tmp_path: Path) -> None:
    node = Node(tmp_path, lease=0.3)
    try:
        lent = await node.lending.lend("o", "m", 300)
        await asyncio.wait_for(lent.worker.exited.wait(), 20)
        await until(lambda: node.scheduler.reserved == 0, "the expired worker's memory to be given back")
        assert lent.worker.pid is not None and gone(lent.worker.pid)
        with pytest.raises(WorkerGone):
            node.lending.renew(lent.id)
    finally:
        await node.close()


async def test_a_renewed_lease_keeps_its_worker(tmp_path: Path) -> None:
    node = Node(tmp_path, lease=2.0)
    try:
        lent = await node.lending.lend("o", "m", 300)
        loop = asyncio.get_running_loop()
        end = loop.time() + 4.5  # more than twice the lease, renewed twenty times a lease
        while loop.time() < end:
            assert node.lending.renew(lent.id) == 2.0
            await asyncio.sleep(0.1)
        assert lent.worker.alive and node.scheduler.reserved == 300
    finally:
        await node.close()


async def test_a_worker_that_dies_frees_its_memory_at_once(node: Node) -> None:
    lent = await node.lending.lend("o", "m", 600)
    assert lent.worker.pid is not None
    os.kill(lent.worker.pid, 9)
    await asyncio.wait_for(lent.worker.exited.wait(), 20)
    assert node.scheduler.reserved == 0 and node.scheduler.reservations == 0  # in the same step as the exit
    with pytest.raises(WorkerGone):
        node.lending.renew(lent.id)
    assert await node.lending.stop(lent.id) is False
    await node.scheduler.acquire(plan("a", 900))  # the room is there again


async def test_the_reservation_blocks_a_load_that_would_not_fit(node: Node) -> None:
    await node.lending.lend("o", "m", 700)
    with pytest.raises(LlmmanError) as caught:
        await node.scheduler.acquire(plan("a", 400))
    assert caught.value.code == "insufficient_memory" and "lent to RPC workers" in caught.value.message
    lease = await node.scheduler.acquire(plan("b", 300))  # what is left is still admitted
    lease.release()


async def test_a_reservation_evicts_idle_models(node: Node) -> None:
    lease = await node.scheduler.acquire(plan("a", 600))
    lease.release()
    lent = await node.lending.lend("o", "m", 700)
    assert node.launcher.started[0].stopped.is_set()
    assert node.scheduler.snapshot() == [] and node.scheduler.reserved == 700
    assert lent.worker.alive


async def test_a_reservation_never_touches_a_busy_model(node: Node) -> None:
    lease = await node.scheduler.acquire(plan("a", 600))
    with pytest.raises(LlmmanError) as caught:
        await node.lending.lend("o", "m", 700)
    assert caught.value.status == 507 and caught.value.code == "insufficient_memory"
    assert not node.launcher.started[0].stopped.is_set() and node.scheduler.reserved == 0
    assert node.lending.listing() == []
    lease.release()


async def test_a_pinned_idle_model_goes_last(node: Node) -> None:
    pinned = await node.scheduler.acquire(plan("pinned", 300), keep_alive=math.inf)
    pinned.release()
    other = await node.scheduler.acquire(plan("other", 300))
    other.release()
    await node.lending.lend("o", "m", 600)  # 400 free: one of the two must go, the unpinned one
    (left,) = node.scheduler.snapshot()
    assert left.reference == "docker.io/ai/pinned:1"


async def test_more_than_the_capacity_is_refused(node: Node) -> None:
    with pytest.raises(LlmmanError) as caught:
        await node.lending.lend("o", "m", 1001)
    assert caught.value.status == 507


async def test_serve_off_is_403(tmp_path: Path) -> None:
    node = Node(tmp_path, serve=False)
    try:
        with pytest.raises(RpcDisabled) as caught:
            await node.lending.lend("o", "m", 1)
        assert caught.value.status == 403 and not node.scheduler.lends
    finally:
        await node.close()


async def test_a_draining_node_lends_nothing_new(node: Node) -> None:
    lent = await node.lending.lend("o", "m", 100)
    node.scheduler.drain()
    with pytest.raises(LlmmanError) as caught:
        await node.lending.lend("o", "m", 100)
    assert caught.value.status == 503 and caught.value.code == "draining"
    assert node.lending.renew(lent.id) == 30.0 and lent.worker.alive  # what it lent already goes on
    node.scheduler.undrain()
    await node.lending.lend("o", "m", 100)


async def test_close_stops_every_worker(tmp_path: Path) -> None:
    node = Node(tmp_path)
    workers = [await node.lending.lend("o", "m", 100) for _ in range(2)]
    await node.close()
    assert all(w.worker.pid is not None and gone(w.worker.pid) for w in workers)
    assert node.scheduler.reserved == 0
    with pytest.raises(LlmmanError) as caught:
        await node.lending.lend("o", "m", 100)
    assert caught.value.status == 503


def test_old_worker_logs_are_pruned(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"rpc-w{i}.log").write_text("x")
        os.utime(tmp_path / f"rpc-w{i}.log", (1000 + i, 1000 + i))
    (tmp_path / "rpc-w0.log.1").write_text("rotated")
    (tmp_path / "docker.io_ai_a_1.log").write_text("a model's log")
    prune_logs(tmp_path, live={"w0"}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "docker.io_ai_a_1.log", "rpc-w0.log", "rpc-w0.log.1", "rpc-w3.log", "rpc-w4.log"]
    prune_logs(tmp_path / "missing", live=set())  # no directory: nothing to do, no error


async def test_a_lend_prunes_the_logs_of_ended_workers(tmp_path: Path) -> None:
    node = Node(tmp_path)
    try:
        for _ in range(3):
            lent = await node.lending.lend("o", "m", 100)
            await node.lending.stop(lent.id)
        live = await node.lending.lend("o", "m", 100)
        logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
        assert f"rpc-{live.id}.log" in logs and len(logs) == 4  # within LOGS_KEPT: all kept
    finally:
        await node.close()


@pytest.mark.parametrize(("bind", "reach", "expected"), [
    ("10.0.0.2", "10.0.0.2", ("10.0.0.2", "10.0.0.2")),
    ("10.0.0.2", "192.168.1.5", ("10.0.0.2", "10.0.0.2")),  # rpc.bind wins over where the request came
    ("0.0.0.0", "192.168.1.5", ("0.0.0.0", "192.168.1.5")),
    ("::", "::ffff:192.168.1.5", ("0.0.0.0", "192.168.1.5")),  # a dual-stack daemon reached over IPv4
    ("", "", ("0.0.0.0", "127.0.0.1")),
    ("localhost", "127.0.0.1", ("localhost", "localhost")),
])
def test_where_a_worker_listens_and_what_its_endpoint_names(bind: str, reach: str,
                                                            expected: tuple[str, str]) -> None:
    assert addresses(bind, reach) == expected


@pytest.mark.parametrize(("bind", "reach"), [("::1", "::1"), ("fd00::2", "fd00::2"), ("::", "fd00::2")])
def test_ipv6_is_refused_at_once(bind: str, reach: str) -> None:
    with pytest.raises(LlmmanError) as caught:
        addresses(bind, reach)
    assert caught.value.status == 503 and caught.value.code == "rpc_ipv6"
    assert "IPv4" in caught.value.message


async def test_rpc_ports_gives_each_worker_the_first_free_port_of_the_range(tmp_path: Path) -> None:
    """``rpc.ports``: a port something else listens on is skipped, each worker gets its own, and a range
    with none left is a 503 that gives the reservation back."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        first = probe.getsockname()[1]
    if first > 65533:
        pytest.skip("no room above the port the OS gave")
    taken = socket.create_server(("127.0.0.1", first))
    node = Node(tmp_path, ports=(first, first + 2))
    try:
        a = await node.lending.lend("o", "m", 100)
        b = await node.lending.lend("o", "m", 100)
        assert (a.worker.port, b.worker.port) == (first + 1, first + 2)
        with pytest.raises(LlmmanError) as caught:
            await node.lending.lend("o", "m", 100)
        assert (caught.value.status, caught.value.code) == (503, "rpc_ports_exhausted")
        assert node.scheduler.reserved == 200 and node.scheduler.reservations == 2
        assert await node.lending.stop(a.id)
        c = await node.lending.lend("o", "m", 100)
        assert c.worker.port == first + 1
    finally:
        taken.close()
        await node.close()
