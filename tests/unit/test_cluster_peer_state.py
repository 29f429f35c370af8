"""The peers' background state (cluster/peers.py): refresh scheduling and jitter, fresh views against one
probe round, shared fetches, and the optimistic accounting of forwards (cluster/optimistic.py), against
real aiohttp peers on loopback with a fake clock and a stepped sleep."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from llmman.cluster.optimistic import add_forwards, plus
from llmman.cluster.peers import JITTER, STALE_AFTER, Peers, jittered, peer_name
from llmman.cluster.placement import ModelLoad, NodeView
from llmman.config.table import HostAddress

REF = "docker.io/ai/smollm2:135m"
OTHER = "docker.io/ai/other:1"
DEADLINE_S = 10.0


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition``, polling the loop, failing after DEADLINE_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


# -- pure parts ------------------------------------------------------------------------------------


class Fixed(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(("draw", "factor"), [(0.0, 1 - JITTER), (0.5, 1.0), (0.25, 1 - JITTER / 2)])
def test_a_refresh_wait_is_the_interval_scaled_by_the_draw(draw: float, factor: float) -> None:
    assert jittered(2.0, Fixed(draw)) == pytest.approx(2.0 * factor)


def test_every_refresh_wait_stays_within_twenty_percent() -> None:
    rng = random.Random(7)
    waits = [jittered(1.0, rng) for _ in range(2000)]
    assert all(0.8 <= w < 1.2 for w in waits)
    assert min(waits) < 0.82 and max(waits) > 1.18  # the whole band is used, not one value
    assert jittered(1.0, Fixed(0.999999)) < 1.2


@pytest.mark.parametrize(("load", "n", "expected"), [
    (ModelLoad(4, 1, 0), 2, ModelLoad(4, 3, 0)),  # into free slots
    (ModelLoad(4, 3, 0), 3, ModelLoad(4, 4, 2)),  # the rest waits
    (ModelLoad(4, 4, 1), 2, ModelLoad(4, 4, 3)),  # saturated: all wait
    (ModelLoad(0, 2, 0), 3, ModelLoad(0, 5, 0)),  # unknown slots (older node): counted as served
    (ModelLoad(2, 0, 1, loading=True), 3, ModelLoad(2, 0, 4, loading=True)),  # loading: every one waits
    (ModelLoad(4, 1, 0, draining=True), 1, ModelLoad(4, 2, 0, draining=True)),
    (ModelLoad(4, 1, 0), 0, ModelLoad(4, 1, 0)),
])
def test_added_requests_fill_slots_then_the_queue(load: ModelLoad, n: int, expected: ModelLoad) -> None:
    assert plus(load, n) == expected


def view(loaded: dict[str, int] | None = None, models: dict[str, ModelLoad] | None = None,
         stored: dict[str, int] | None = None) -> NodeView:
    return NodeView("b:1", 1000, loaded or {}, stored or {}, models=models or {})


@pytest.mark.parametrize(("before", "forwards", "loaded", "models"), [
    # a loaded model reported with its load: the forwards join it
    (view({REF: 100}, {REF: ModelLoad(2, 1, 0)}), {REF: 3}, {REF: 100}, {REF: ModelLoad(2, 2, 2)}),
    # the reference matches whatever its case
    (view({REF: 100}, {REF: ModelLoad(2, 0, 0)}), {REF.upper(): 1}, {REF: 100}, {REF: ModelLoad(2, 1, 0)}),
    # an older node lists it loaded without a load: unknown slots
    (view({REF: 100}), {REF: 2}, {REF: 100}, {REF: ModelLoad(0, 2, 0)}),
    # not loaded there: the forward makes it load, at its stored size (from any node's sizes)
    (view(stored={REF: 100}), {REF: 2}, {REF: 100}, {REF: ModelLoad(0, 0, 2, loading=True)}),
    (view(), {OTHER: 1}, {OTHER: 0}, {OTHER: ModelLoad(0, 0, 1, loading=True)}),
    # two models, one untouched
    (view({REF: 100, OTHER: 50}, {REF: ModelLoad(1, 1, 0), OTHER: ModelLoad(1, 0, 0)}), {OTHER: 1},
     {REF: 100, OTHER: 50}, {REF: ModelLoad(1, 1, 0), OTHER: ModelLoad(1, 1, 0)}),
])
def test_a_view_adds_the_forwards_started_since(before: NodeView, forwards: dict[str, int],
                                                loaded: dict[str, int], models: dict[str, ModelLoad]) -> None:
    after = add_forwards(before, forwards, {REF: 100})
    assert dict(after.loaded) == loaded and dict(after.models) == models
    assert all(after.has_loaded(ref) for ref in forwards)
    assert after.memory == before.memory and after.name == before.name


def test_no_forwards_leave_the_view_as_it_is() -> None:
    before = view({REF: 100}, {REF: ModelLoad(2, 1, 0)})
    assert add_forwards(before, {}, {}) is before
    assert add_forwards(before, {REF: 0}, {}) is before


# -- peers on loopback --------------------------------------------------------------------------------


@dataclass
class Peer:
    """A peer whose /llmman/node answers ``doc`` (or ``status``) once ``gate`` is set; ``hits`` counts."""

    address: HostAddress = field(default_factory=lambda: HostAddress("http", "127.0.0.1", 0))
    doc: dict[str, object] = field(default_factory=lambda: {
        "memory": 1000, "loaded": {REF: 100}, "stored": {REF: 100}, "version": "9.9",
        "models": {REF: {"slots": 4, "in_flight": 1, "queued": 0}}})
    status: int = 200
    hits: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    runner: web.AppRunner | None = None

    @property
    def name(self) -> str:
        return peer_name(self.address)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Peer]]]:
    runners: list[web.AppRunner] = []

    async def start(port: int = 0) -> Peer:
        state = Peer()
        state.gate.set()

        async def node(_: web.Request) -> web.Response:
            state.hits += 1
            await state.gate.wait()
            return web.json_response(state.doc, status=state.status)

        app = web.Application()
        app.router.add_get("/llmman/node", node)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        state.runner = runner
        await web.TCPSite(runner, "127.0.0.1", port).start()
        state.address = HostAddress("http", "127.0.0.1", runner.addresses[0][1])
        return state

    yield start
    for runner in runners:
        await runner.cleanup()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Steps:
    """A sleep that records each wait and returns only when the test lets one through."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self._go: asyncio.Queue[None] = asyncio.Queue()

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await self._go.get()

    def step(self) -> None:
        self._go.put_nowait(None)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def make(session: aiohttp.ClientSession, *peers: Peer, clock: Clock | None = None,
         steps: Steps | None = None, refresh: float = 1.0) -> Peers:
    return Peers(session, tuple(p.address for p in peers), refresh=refresh, clock=clock or Clock(),
                 rng=Fixed(0.5), sleep=steps or Steps(), retry=60)


async def test_each_peer_is_fetched_at_start_then_after_every_jittered_wait(
        serve: Callable[[], Awaitable[Peer]], session: aiohttp.ClientSession) -> None:
    b, c = await serve(), await serve()
    steps = Steps()
    peers = Peers(session, (b.address, c.address), refresh=2.0, clock=Clock(), rng=random.Random(3),
                  sleep=steps)
    peers.start()
    try:
        await until(lambda: b.hits == 1 and c.hits == 1 and len(steps.waits) == 2, "the first fetches")
        assert all(1.6 <= w < 2.4 for w in steps.waits), steps.waits
        assert peers.probe_rounds == 0  # the refresh is not a probe round
        steps.step()  # one peer's wait ends: that peer alone is fetched again
        await until(lambda: b.hits + c.hits == 3 and len(steps.waits) == 3, "the second fetch")
        assert sorted([b.hits, c.hits]) == [1, 2]
    finally:
        await peers.close()


async def test_fresh_views_answer_without_a_probe_and_stale_ones_cost_one_round(
        serve: Callable[[], Awaitable[Peer]], session: aiohttp.ClientSession) -> None:
    b, c = await serve(), await serve()
    clock = Clock()
    peers = make(session, b, c, clock=clock)
    peers.start()
    try:
        await until(lambda: len(peers.states()) == 2 and all(s.seen for s in peers.states()), "sightings")
        hits = (b.hits, c.hits)
        clock.now += STALE_AFTER * peers.refresh  # as old as fresh views may be
        views = await peers.current()
        assert sorted(v.name for v in views) == sorted([b.name, c.name])
        assert (b.hits, c.hits) == hits and peers.probe_rounds == 0
        assert all(v.has_loaded(REF) for v in views)

        clock.now += 0.01  # now too old: one probe round, shared by every caller
        b.gate.clear()
        waiting = [asyncio.ensure_future(peers.current()) for _ in range(5)]
        await until(lambda: b.hits == hits[0] + 1, "the probe")
        b.gate.set()
        answers = await asyncio.gather(*waiting)
        assert peers.probe_rounds == 1 and (b.hits, c.hits) == (hits[0] + 1, hits[1] + 1)
        assert all(sorted(v.name for v in a) == sorted([b.name, c.name]) for a in answers)
        await peers.current()  # the probe's answers are the new sightings: fresh again
        assert peers.probe_rounds == 1
        await peers.current(probe=True)  # asked for: a round however fresh the views are
        assert peers.probe_rounds == 2 and (b.hits, c.hits) == (hits[0] + 2, hits[1] + 2)
    finally:
        await peers.close()


async def test_without_a_refresh_every_call_probes(serve: Callable[[], Awaitable[Peer]],
                                                   session: aiohttp.ClientSession) -> None:
    b = await serve()
    peers = make(session, b, refresh=0.0)
    peers.start()  # nothing to start
    try:
        for n in (1, 2):
            assert [v.name for v in await peers.current()] == [b.name]
            assert peers.probe_rounds == n and b.hits == n
    finally:
        await peers.close()


class Joining(Peers):
    """Peers counting the calls that look for a fetch in flight (the join happens in the same step)."""

    joins = 0

    async def _probe_one(self, address: HostAddress) -> NodeView | None:
        self.joins += 1
        return await super()._probe_one(address)


async def test_a_probe_joins_the_refresh_in_flight_and_a_failure_is_seen_once(
        serve: Callable[[], Awaitable[Peer]], session: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "llmman.cluster")
    b = await serve()
    b.status = 500
    b.gate.clear()
    peers = Joining(session, (b.address,), refresh=1.0, clock=Clock(), sleep=Steps(), retry=60)
    peers.start()
    try:
        await until(lambda: b.hits == 1, "the refresh to reach the peer")
        probe = asyncio.ensure_future(peers.current())  # no sighting yet: a probe round, joining it
        await until(lambda: peers.joins == 2, "the probe to join the refresh")
        b.gate.set()
        assert await probe == []
        assert b.hits == 1  # one request served the refresh and the probe
        assert peers.up() == [] and caplog.text.count(f"peer {b.name} left out") == 1
        assert peers.states()[0].down == "/llmman/node answered 500"
        assert await peers.current() == [] and b.hits == 1  # a down peer costs nothing
    finally:
        await peers.close()


async def test_a_down_peer_comes_back_with_a_fresh_sighting(serve: Callable[[], Awaitable[Peer]],
                                                            session: aiohttp.ClientSession) -> None:
    b = await serve()
    b.status = 503
    peers = Peers(session, (b.address,), refresh=1.0, retry=0.01, rng=Fixed(0.5), sleep=Steps())
    peers.start()
    try:
        await until(lambda: peers.up() == [], "the peer to be left out")
        assert peers.states()[0].seen is None
        b.status = 200
        await until(lambda: peers.up() == [b.address], "the re-probe to take it back")
        state = peers.states()[0]
        assert state.down is None and state.seen is not None and state.seen.version == "9.9"
        assert [v.name for v in await peers.current()] == [b.name] and peers.probe_rounds == 0
    finally:
        await peers.close()


async def test_forwards_started_after_the_fetch_are_added_until_they_end(
        serve: Callable[[], Awaitable[Peer]], session: aiohttp.ClientSession) -> None:
    b = await serve()
    steps = Steps()
    peers = make(session, b, steps=steps)
    with peers.forwarding(b.address, REF):  # before the fetch: the peer's own figures hold it
        peers.start()
        try:
            await until(lambda: b.hits == 1 and len(steps.waits) == 1, "the first fetch")
            [seen] = await peers.current()
            assert seen.load_of(REF) == ModelLoad(4, 1, 0)
            with peers.forwarding(b.address, REF), peers.forwarding(b.address, REF.upper()), \
                    peers.forwarding(b.address, OTHER):
                [busier] = await peers.current()
                assert busier.load_of(REF) == ModelLoad(4, 3, 0)
                assert busier.load_of(OTHER) == ModelLoad(0, 0, 1, loading=True)
                assert peers.forwarded(b.address, REF) == 3 and peers.states()[0].forwarded == 4
                steps.step()  # the next fetch: what the peer reports now includes them
                await until(lambda: b.hits == 2 and len(steps.waits) == 2, "the next fetch")
                [again] = await peers.current()
                assert again.load_of(REF) == ModelLoad(4, 1, 0) and again.load_of(OTHER) is None
            [after] = await peers.current()  # ended ones are never added
            assert after.load_of(REF) == ModelLoad(4, 1, 0)
        finally:
            await peers.close()
    assert peers.forwarded(b.address, REF) == 0


async def test_a_probe_round_adds_the_forwards_started_since_it_was_sent(
        serve: Callable[[], Awaitable[Peer]], session: aiohttp.ClientSession) -> None:
    b = await serve()
    peers = make(session, b, refresh=0.0)
    b.gate.clear()
    probe = asyncio.ensure_future(peers.current())
    await until(lambda: b.hits == 1, "the probe")
    with peers.forwarding(b.address, REF):  # started while the probe was out: counted (leans busy)
        b.gate.set()
        [seen] = await probe
        assert seen.load_of(REF) == ModelLoad(4, 2, 0)
    await peers.close()


async def test_states_say_how_long_ago_each_peer_was_seen(serve: Callable[[], Awaitable[Peer]],
                                                          session: aiohttp.ClientSession) -> None:
    b = await serve()
    clock = Clock()
    never = HostAddress("http", "127.0.0.1", 9)
    peers = Peers(session, (b.address, never), refresh=1.0, clock=clock, retry=60, sleep=Steps())
    assert [(s.seen, s.age, s.down) for s in peers.states()] == [(None, None, None)] * 2
    await peers.probe()
    clock.now += 2.5
    seen, gone = peers.states()
    assert seen.age == 2.5 and seen.seen is not None and seen.seen.view.has_loaded(REF)
    assert gone.seen is None and gone.down  # refused: down, with the reason
    await peers.close()


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_peer_not_up_yet_is_asked_by_each_decision_until_it_answers(
        serve: Callable[..., Awaitable[Peer]], session: aiohttp.ClientSession) -> None:
    b, port = await serve(), unused_port()
    later = HostAddress("http", "127.0.0.1", port)
    clock = Clock()
    peers = Peers(session, (b.address, later), refresh=1.0, clock=clock, retry=60, rng=Fixed(0.5),
                  sleep=Steps())
    peers.start()
    try:
        await until(lambda: peers.states()[0].seen is not None and peers.states()[1].down is not None,
                    "the first fetches")
        assert peers.up() == [b.address, later]  # refused before it ever answered: not down
        rounds = peers.probe_rounds
        assert [v.name for v in await peers.current()] == [b.name]  # b is fresh, yet the round is made
        assert [v.name for v in await peers.current()] == [b.name]
        assert peers.probe_rounds == rounds + 2
        assert peers.states()[1].down  # shown down (with the refusal) meanwhile
        await serve(port)  # it starts listening: the next decision finds it
        assert sorted(v.name for v in await peers.current()) == sorted([b.name, peer_name(later)])
        assert peers.states()[1].down is None
        await peers.current()
        assert peers.probe_rounds == rounds + 3  # a peer like the others now: fresh views, no round
    finally:
        await peers.close()


async def test_a_peer_seen_once_that_then_refuses_is_down(serve: Callable[..., Awaitable[Peer]],
                                                         session: aiohttp.ClientSession) -> None:
    b = await serve()
    peers = Peers(session, (b.address,), refresh=1.0, retry=60)
    assert [v.name for v in await peers.probe()] == [b.name]
    assert b.runner is not None
    await b.runner.cleanup()  # it stops listening: refused now, after it was seen
    assert await peers.probe() == []
    assert peers.up() == [] and peers.states()[0].down
    rounds = peers.probe_rounds
    assert await peers.current() == [] and peers.probe_rounds == rounds  # costs nothing more
    await peers.close()
