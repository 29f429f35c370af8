"""The aggregation's short memory of where models are loaded, and the shared probe (cluster/recent.py,
cluster/peers.py), against a real aiohttp peer on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from llmman.cluster.peers import Peers
from llmman.cluster.recent import RecentLoaded
from llmman.config.table import HostAddress

A, B = HostAddress("http", "127.0.0.1", 1), HostAddress("http", "127.0.0.1", 2)
REF = "docker.io/ai/smollm2:135m"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_lasts_its_ttl_and_no_longer() -> None:
    clock = Clock()
    recent = RecentLoaded(2.0, clock)
    recent.put(REF, A)
    clock.now += 1.5
    assert recent.get(REF.upper()) == (A, 1.5)
    clock.now += 0.5
    assert recent.get(REF) is None
    recent.put(REF, A)
    assert recent.get(REF) == (A, 0.0)  # a new probe starts the time again


def test_forgetting_a_model_or_a_failed_peer() -> None:
    recent = RecentLoaded(2.0, Clock())
    recent.put(REF, A)
    recent.put("docker.io/ai/other:1", B)
    recent.forget(REF)
    assert recent.get(REF) is None and recent.get("docker.io/ai/other:1") == (B, 0.0)
    recent.forget_peer(B)
    assert recent.get("docker.io/ai/other:1") is None


def test_a_zero_ttl_remembers_nothing() -> None:
    recent = RecentLoaded(0.0, Clock())
    recent.put(REF, A)
    assert recent.get(REF) is None


@dataclass
class Peer:
    address: HostAddress
    hits: list[int] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    """A peer whose /llmman/node answers once ``release`` is set; ``hits`` counts the probes."""
    state = Peer(HostAddress("http", "127.0.0.1", 0))

    async def node(_: web.Request) -> web.Response:
        state.hits.append(1)
        state.arrived.set()
        await state.release.wait()
        return web.json_response({"memory": 10, "loaded": {REF: 5}, "stored": {REF: 5}})

    app = web.Application()
    app.router.add_get("/llmman/node", node)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.address = HostAddress("http", "127.0.0.1", runner.addresses[0][1])
    try:
        yield state
    finally:
        await runner.cleanup()


async def test_requests_during_a_probe_share_it(peer: Peer) -> None:
    async with aiohttp.ClientSession() as session:
        peers = Peers(session, (peer.address,))
        waiting = [asyncio.ensure_future(peers.probe()) for _ in range(5)]
        await asyncio.wait_for(peer.arrived.wait(), 10)
        peer.release.set()
        views = await asyncio.gather(*waiting)
        assert peer.hits == [1]
        assert all(v and v[0].has_loaded(REF) for v in views)
        await peers.probe()  # the next one asks again
        assert len(peer.hits) == 2
        await peers.close()


async def test_a_peer_marked_down_is_forgotten(peer: Peer) -> None:
    address = peer.address
    peer.release.set()
    async with aiohttp.ClientSession() as session:
        peers = Peers(session, (address,), retry=60)
        peers.recent.put(REF, address)
        peers.mark_down(address, "test")
        assert peers.recent.get(REF) is None and peers.up() == []
        await peers.close()
