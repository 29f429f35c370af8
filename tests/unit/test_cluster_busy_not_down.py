"""Busy is not down (cluster/peers.py, cluster/router.py; docs/aggregation.md#busy-is-not-down): a peer
whose probe times out is unresponsive and keeps what it was seen holding, one that refuses is dead; the
router answers 503 with ``Retry-After`` for a model only an unresponsive peer holds, and decides as before
for a dead one or a model nobody had. Against real aiohttp peers on loopback: one that answers its
``/llmman/node``, then holds every request without answering (as a daemon whose loop lags), then stops
listening."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import cast

import aiohttp
import pytest
from aiohttp import web
from tests.unit.test_cluster_router import FakeScheduler, FakeStore

from llmman.cluster.peers import Peers, peer_name, timed_out
from llmman.cluster.router import PEER_UNRESPONSIVE, Forward, Intent, Local, Origin, Policy, Router, Target
from llmman.config.table import HostAddress
from llmman.errors import ServiceUnavailable
from llmman.sched.scheduler import Scheduler
from llmman.store import Store

M = "docker.io/ai/smollm2:135m"
OTHER = "docker.io/ai/other:1"
GB = 10**9
OWN = HostAddress("http", "127.0.0.1", 17434)


@dataclass
class Peer:
    """A peer on loopback: ``mode`` ``answer`` (its node document: ``M`` loaded), ``hold`` (accept and
    never answer) or, after :meth:`close`, nothing listening (refused)."""

    address: HostAddress
    runner: web.AppRunner
    mode: str = "answer"
    held: list[asyncio.Event] = field(default_factory=list)

    async def close(self) -> None:
        for gate in self.held:
            gate.set()
        await self.runner.cleanup()


@pytest.fixture()
async def peer() -> AsyncIterator[Peer]:
    state: dict[str, Peer] = {}

    async def node(request: web.Request) -> web.Response:
        me = state["peer"]
        if me.mode == "hold":
            gate = asyncio.Event()
            me.held.append(gate)
            await gate.wait()
        return web.json_response({"memory": 8 * GB, "loaded": {M: GB}, "stored": {M: GB},
                                  "models": {M: {"slots": 1, "in_flight": 1, "queued": 0}}})

    app = web.Application()
    app.router.add_get("/llmman/node", node)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    state["peer"] = Peer(HostAddress("http", "127.0.0.1", port), runner)
    yield state["peer"]
    await state["peer"].close()


@pytest.fixture()
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def router(peers: Peers, stored: dict[str, int] | None = None, spread: str = "off") -> Router:
    scheduler, store = cast(Scheduler, FakeScheduler(capacity=8 * GB)), cast(Store, FakeStore(stored or {}))
    return Router(peers, scheduler, store, OWN, {}, policy=Policy(spread=spread))


def test_a_timeout_is_slow_and_a_refusal_is_not() -> None:
    assert timed_out(TimeoutError()) and timed_out(aiohttp.ServerTimeoutError())
    assert not timed_out(ConnectionRefusedError()) and not timed_out(ConnectionResetError())
    assert not timed_out(aiohttp.ServerDisconnectedError()) and not timed_out(ValueError("answered 401"))


async def test_a_peer_whose_probe_times_out_is_unresponsive_and_keeps_what_it_held(
        peer: Peer, session: aiohttp.ClientSession) -> None:
    peers = Peers(session, (peer.address,), timeout=0.3, retry=3600)
    assert [v.name for v in await peers.probe()] == [peer_name(peer.address)]
    peer.mode = "hold"
    assert await peers.probe() == []  # timed out: left out of the decision
    assert peers.up() == [] and peers.unresponsive(peer.address)
    [held] = peers.holding(M)
    assert held.address == peer.address and held.loaded and held.age >= 0
    assert peers.holding(OTHER) == []  # it never had that one
    await peers.close()


async def test_a_peer_that_refuses_is_dead_and_holds_nothing(peer: Peer,
                                                              session: aiohttp.ClientSession) -> None:
    peers = Peers(session, (peer.address,), timeout=0.3, retry=3600)
    await peers.probe()
    await peer.close()
    assert await peers.probe() == []
    assert peers.up() == [] and not peers.unresponsive(peer.address)
    assert peers.holding(M) == []
    await peers.close()


async def test_a_forward_failure_is_judged_by_the_last_probe(peer: Peer,
                                                              session: aiohttp.ClientSession) -> None:
    """A forward's failure comes without its exception (Router.failed): when the silence check's probe
    just timed out the peer is unresponsive; when its last probe answered, dead."""
    peers = Peers(session, (peer.address,), timeout=0.3, retry=3600)
    await peers.probe()
    r = router(peers)
    r.failed(Target(peer.address), "reset mid-answer")
    assert not peers.unresponsive(peer.address) and peers.holding(M) == []
    await peers.close()
    peers = Peers(session, (peer.address,), timeout=0.3, retry=3600)
    await peers.probe()
    peer.mode = "hold"
    with pytest.raises(TimeoutError):
        await peers.get_json(peer.address, "/llmman/node")  # the silence check's probe
    router(peers).failed(Target(peer.address), "silent and not answering its probe")
    assert peers.unresponsive(peer.address) and len(peers.holding(M)) == 1
    await peers.close()


@pytest.mark.parametrize(("intent", "spread"), [(Intent.INFER, "off"), (Intent.INFER, "replicas"),
                                               (Intent.INFER, "loaded"), (Intent.SHOW, "off"),
                                               (Intent.UNLOAD, "off")])
async def test_a_model_only_an_unresponsive_peer_holds_is_503_with_retry_after(
        peer: Peer, session: aiohttp.ClientSession, intent: Intent, spread: str) -> None:
    peers = Peers(session, (peer.address,), timeout=0.3, retry=2.0)
    r = router(peers, spread=spread)
    first = await r.decide(M, intent, Origin())
    # B alone holds it: when it fails the decision is made again, never a copy or pull here
    assert first == Forward((Target(peer.address),), None)
    peer.mode = "hold"
    with pytest.raises(ServiceUnavailable) as caught:
        await r.decide(M, intent, Origin(), fresh=True, tried=frozenset({peer_name(peer.address)}))
    assert caught.value.code == PEER_UNRESPONSIVE and caught.value.status == 503
    assert caught.value.retry_after == 2.0 and peer_name(peer.address) in caught.value.message
    # a model it never had is decided as before (here: served here, which pulls or answers 404)
    assert await r.decide(OTHER, intent, Origin()) == Local()
    # a model this node stores is served here
    assert await router(peers, stored={M: GB}, spread=spread).decide(M, intent, Origin()) == Local()
    await peers.close()


async def test_a_dead_holder_is_decided_as_before(peer: Peer, session: aiohttp.ClientSession) -> None:
    peers = Peers(session, (peer.address,), timeout=0.3, retry=3600)
    r = router(peers)
    await r.decide(M, Intent.INFER, Origin())
    await peer.close()
    assert await r.decide(M, Intent.INFER, Origin(), fresh=True,
                          tried=frozenset({peer_name(peer.address)})) == Local()
    await peers.close()


async def test_a_reprobe_that_finds_it_refusing_makes_it_dead(peer: Peer,
                                                               session: aiohttp.ClientSession) -> None:
    peers = Peers(session, (peer.address,), timeout=0.3, retry=0.05)
    await peers.probe()
    peer.mode = "hold"
    await peers.probe()
    assert peers.unresponsive(peer.address)
    await peer.close()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while peers.unresponsive(peer.address):  # the re-probe every 0.05 s finds it refusing
        assert loop.time() < deadline, "the re-probe did not find the peer dead"
        await asyncio.sleep(0.01)
    assert peers.holding(M) == [] and peers.up() == []
    await peers.close()
