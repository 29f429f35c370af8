"""The router's decision (cluster/router.py), table-tested on snapshots: which node serves, what it copies
from, which peers a forward tries in order, and what a forwarded request's source header may name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

import aiohttp
import pytest

from llmman.cluster.copy import PullSource
from llmman.cluster.peers import Peers, peer_name
from llmman.cluster.placement import ModelLoad, NodeView
from llmman.cluster.router import Forward, Intent, Local, Origin, Policy, Router, Target
from llmman.config.table import HostAddress
from llmman.sched.scheduler import Scheduler
from llmman.sched.table import LoadedSnapshot
from llmman.store import Store

GB = 10**9
M = "docker.io/ai/smollm2:135m"
OWN = HostAddress("http", "127.0.0.1", 17434)
B = HostAddress("http", "127.0.0.2", 17434)
C = HostAddress("http", "127.0.0.3", 17434)
DIGEST = "sha256:" + "a" * 64


@dataclass
class Snap:
    reference: str
    memory: int
    refcount: int = 0
    slots: int = 4
    ready: bool = True
    draining: bool = False

    # the real snapshot's rule, not a copy of it
    in_flight = LoadedSnapshot.in_flight
    queued = LoadedSnapshot.queued


@dataclass
class Stored:
    reference: str
    size: int
    digest: str = DIGEST


@dataclass
class FakeScheduler:
    """What a router reads of the scheduler: what is loaded (with its requests and slots), the capacity,
    the queue, the node state."""

    capacity: int
    loaded: Mapping[str, int] = field(default_factory=dict)
    draining: bool = False
    node_memory: None = None  # no devices: the node document's per-device part stays empty
    busy: dict[str, int] = field(default_factory=dict)  # reference -> requests on it (served or waiting)
    slots: int = 4
    stopping: set[str] = field(default_factory=set)  # references being stopped (a draining copy)
    lends: bool = False  # rpc.serve, and the RPC workers' reservations (the node document's rpc part)
    reserved: int = 0
    reservations: int = 0

    def snapshot(self) -> list[Snap]:
        return [Snap(ref, size, self.busy.get(ref, 0), self.slots, draining=ref in self.stopping)
                for ref, size in self.loaded.items()]

    def queued(self) -> int:
        return 0


@dataclass
class FakeStore:
    stored: Mapping[str, int] = field(default_factory=dict)

    def list(self) -> list[Stored]:
        return [Stored(ref, size) for ref, size in self.stored.items()]

    def find(self, ref: Any) -> Stored | None:
        key = str(ref).lower()
        return next((Stored(r, s) for r, s in self.stored.items() if r.lower() == key), None)


class FixedPeers(Peers):
    """Peers whose probe answers the given views (no network); marks down are recorded."""

    def __init__(self, views: list[NodeView], addresses: tuple[HostAddress, ...] = (B, C)) -> None:
        super().__init__(cast(aiohttp.ClientSession, None), addresses, api_key="peer-key")
        self.views = views
        self.probes = 0
        self.asked_now = 0  # decisions that wanted a probe round whatever the background views' age
        self.marked: list[str] = []

    async def probe(self) -> list[NodeView]:
        self.probes += 1
        return [v for v in self.views if v.name not in self.marked]

    async def current(self, *, probe: bool = False) -> list[NodeView]:
        self.asked_now += probe
        return await self.probe()

    def mark_down(self, address: HostAddress, why: str, *, slow: bool | None = None) -> None:
        self.recent.forget_peer(address)
        self.marked.append(peer_name(address))


def peer(address: HostAddress, memory_gb: float, loaded: Mapping[str, float] | None = None,
         stored: Mapping[str, float] | None = None) -> NodeView:
    def gb(table: Mapping[str, float] | None) -> dict[str, int]:
        return {k: int(v * GB) for k, v in (table or {}).items()}

    return NodeView(peer_name(address), int(memory_gb * GB), gb(loaded), gb(stored), address.client_url())


def router(peers: Peers | None, *, memory_gb: float = 8, loaded: Mapping[str, float] | None = None,
           stored: Mapping[str, float] | None = None) -> Router:
    scheduler = FakeScheduler(int(memory_gb * GB), {k: int(v * GB) for k, v in (loaded or {}).items()})
    store = FakeStore({k: int(v * GB) for k, v in (stored or {}).items()})
    return Router(peers, cast(Scheduler, scheduler), cast(Store, store), OWN, {}, policy=Policy(spread="off"))


async def test_a_node_without_peers_serves_everything_itself() -> None:
    assert await router(None).decide("smollm2:135m", Intent.INFER, Origin()) == Local()


async def test_a_peer_stores_it_but_has_no_room_so_this_node_copies_from_it() -> None:
    peers = FixedPeers([peer(B, 0.01, stored={M: 0.1})])
    decision = await router(peers, memory_gb=8).decide("smollm2:135m", Intent.INFER, Origin())
    assert decision == Local(PullSource(B, "peer-key"))


async def test_loaded_on_a_peer_forwards_there_then_the_recent_memory_skips_the_probe() -> None:
    peers = FixedPeers([peer(B, 8, loaded={M: 0.1}, stored={M: 0.1})])
    r = router(peers, memory_gb=8)
    first = await r.decide("smollm2:135m", Intent.INFER, Origin())
    # B alone holds it: when B fails, the decision is made again (B may only be slow), not a copy here
    assert first == Forward((Target(B),), otherwise=None)
    again = await r.decide("smollm2:135m", Intent.INFER, Origin())
    assert again == Forward((Target(B),), otherwise=None) and peers.probes == 1
    fresh = await r.decide("smollm2:135m", Intent.INFER, Origin(), fresh=True)
    assert fresh == first and peers.probes == 2
    # when this node stores it too, the forward falls back to serving it here
    stored = await router(peers, memory_gb=8, stored={M: 0.1}).decide(M, Intent.INFER, Origin(), fresh=True)
    assert stored == Forward((Target(B),), Local())


async def test_a_failed_target_is_marked_down_and_forgotten_by_the_recent_memory() -> None:
    peers = FixedPeers([peer(B, 8, loaded={M: 0.1}, stored={M: 0.1})])
    r = router(peers)
    await r.decide(M, Intent.INFER, Origin())
    r.failed(Target(B), "refused")
    assert peers.marked == [peer_name(B)] and peers.recent.get(M) is None


async def test_this_node_stores_it_but_only_a_peer_has_room_the_peer_copies_from_us() -> None:
    peers = FixedPeers([peer(B, 8)], addresses=(B,))
    decision = await router(peers, memory_gb=1, loaded={"docker.io/ai/big:1": 1}, stored={M: 0.1}) \
        .decide(M, Intent.INFER, Origin())
    assert decision == Forward((Target(B, "http://*:17434", DIGEST),), Local())


async def test_candidates_are_tried_in_rank_order_until_this_node() -> None:
    peers = FixedPeers([peer(B, 64), peer(C, 32)])
    decision = await router(peers, memory_gb=16).decide(M, Intent.INFER, Origin())
    assert decision == Forward((Target(B), Target(C)), Local())


async def test_loaded_here_is_served_here_without_a_probe() -> None:
    peers = FixedPeers([peer(B, 64, loaded={M: 0.1})])
    assert await router(peers, loaded={M: 0.1}, stored={M: 0.1}).decide(M, Intent.INFER, Origin()) == Local()
    assert peers.probes == 0


@pytest.mark.parametrize("intent", [Intent.UNLOAD, Intent.SHOW])
async def test_unload_and_show_go_where_the_model_is_and_never_use_the_recent_memory(intent: Intent) -> None:
    views = [peer(B, 8, loaded={M: 0.1}, stored={M: 0.1}), peer(C, 64)]
    peers = FixedPeers(views)
    r = router(peers, memory_gb=128)
    await r.decide(M, Intent.INFER, Origin())  # remembers B
    assert await r.decide(M, intent, Origin()) == Forward((Target(B),), None)  # B alone holds it
    assert peers.recent.get(M) is None


async def test_unload_of_a_model_loaded_nowhere_goes_to_a_node_storing_it() -> None:
    peers = FixedPeers([peer(B, 8, stored={M: 0.1})])
    assert await router(peers).decide(M, Intent.UNLOAD, Origin()) == Forward((Target(B),), None)
    assert await router(peers, stored={M: 0.1}).decide(M, Intent.UNLOAD, Origin()) == Local()
    assert await router(FixedPeers([peer(B, 8)])).decide(M, Intent.UNLOAD, Origin()) == Local()


async def test_a_name_that_does_not_parse_is_served_here() -> None:
    peers = FixedPeers([peer(B, 8, loaded={M: 0.1})])
    assert await router(peers).decide("not a name!", Intent.INFER, Origin()) == Local()
    assert peers.probes == 0


async def test_a_forwarded_request_is_served_here_copying_only_from_a_configured_peer() -> None:
    r = router(FixedPeers([]))
    hop = Origin(hop=True, source="http://127.0.0.2:17434", digest=DIGEST)
    assert await r.decide(M, Intent.INFER, hop) == Local(PullSource(B, "peer-key", DIGEST))
    stranger = Origin(hop=True, source="http://10.9.9.9:17434")
    assert await r.decide(M, Intent.INFER, stranger) == Local()
    assert await r.decide(M, Intent.INFER, Origin(hop=True)) == Local()


async def test_a_wildcard_source_is_the_connection_address_or_the_peer_that_stores_it() -> None:
    peers = FixedPeers([peer(C, 8, stored={M: 0.1})])
    r = router(peers)
    by_address = Origin(hop=True, source="http://*:17434", client_host="127.0.0.2")
    assert await r.decide(M, Intent.INFER, by_address) == Local(PullSource(B, "peer-key"))
    unknown = Origin(hop=True, source="http://*:17434", client_host="192.0.2.1")
    assert await r.decide(M, Intent.INFER, unknown) == Local(PullSource(C, "peer-key"))


# --- Spreading, replicas, fallback nodes, draining, affinity (spread = loaded | replicas) -----------------

class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def loaded_peer(address: HostAddress, busy: int = 0, slots: int = 4, *, fallback: bool = False,
                state: str = "serving", draining: bool = False) -> NodeView:
    """A peer with ``M`` stored and loaded, ``busy`` requests on its ``slots`` slots."""
    served = min(busy, slots)
    return NodeView(peer_name(address), 8 * GB, {M: GB // 10}, {M: GB // 10}, address.client_url(),
                    state=state, fallback=fallback,
                    models={M: ModelLoad(slots, served, busy - served, draining=draining)})


def spreading(peers: Peers, *, busy: int | None = None, stored: bool = True, clock: Clock | None = None,
              draining: bool = False, stopping: bool = False, **policy: Any) -> tuple[Router, FakeScheduler]:
    """A router under ``spread = replicas`` (or ``policy``'s) on an 8 GB node; ``busy`` not None: ``M``
    is loaded here (4 slots) with that many requests on it."""
    scheduler = FakeScheduler(8 * GB, {M: GB // 10} if busy is not None else {}, draining=draining,
                              busy={M: busy or 0}, stopping={M} if stopping else set())
    store = FakeStore({M: GB // 10} if stored else {})
    r = Router(peers, cast(Scheduler, scheduler), cast(Store, store), OWN, {},
               policy=Policy(**{"spread": "replicas", **policy}), clock=clock or Clock())
    return r, scheduler


@pytest.mark.parametrize("spread", ["loaded", "replicas"])
async def test_a_spare_slot_here_is_served_here_without_looking_at_the_peers(spread: str) -> None:
    peers = FixedPeers([loaded_peer(B)])
    r, _ = spreading(peers, busy=3, spread=spread)
    assert await r.decide(M, Intent.INFER, Origin()) == Local()
    assert peers.probes == 0


@pytest.mark.parametrize("spread", ["loaded", "replicas"])
async def test_full_here_goes_to_a_loaded_peer_with_a_spare_slot(spread: str) -> None:
    peers = FixedPeers([loaded_peer(B, busy=4), loaded_peer(C, busy=1)])
    r, _ = spreading(peers, busy=4, spread=spread)
    assert await r.decide(M, Intent.INFER, Origin()) == Forward((Target(C),), Local())


async def test_loaded_prefers_the_most_spare_slots_replicas_the_first_with_any() -> None:
    views = [loaded_peer(B, busy=3), loaded_peer(C, busy=0)]
    loaded, _ = spreading(FixedPeers(views), busy=4, spread="loaded")
    assert await loaded.decide(M, Intent.INFER, Origin()) == Forward((Target(C), Target(B)), Local())
    replicas, _ = spreading(FixedPeers(views), busy=4)
    assert await replicas.decide(M, Intent.INFER, Origin()) == Forward((Target(B), Target(C)), Local())


async def test_no_copy_has_a_spare_slot_the_least_busy_one_and_ties_stay_local() -> None:
    r, scheduler = spreading(FixedPeers([loaded_peer(B, busy=5)]), busy=5, spread="loaded")
    assert await r.decide(M, Intent.INFER, Origin()) == Local()
    scheduler.busy[M] = 7
    assert await r.decide(M, Intent.INFER, Origin()) == Forward((Target(B),), Local())


async def test_a_burst_counts_the_requests_placed_here_before_the_scheduler_sees_them() -> None:
    peers = FixedPeers([loaded_peer(B)])
    clock = Clock()
    r, _ = spreading(peers, busy=0, clock=clock)
    for _ in range(4):
        assert await r.decide(M, Intent.INFER, Origin()) == Local()
    assert await r.decide(M, Intent.INFER, Origin()) == Forward((Target(B),), Local())
    clock.now += 1  # the scheduler would count them by now: it says 0, so they finished
    assert await r.decide(M, Intent.INFER, Origin()) == Local()


async def test_another_copy_loads_only_after_every_copy_stayed_saturated_for_replica_after() -> None:
    peers = FixedPeers([peer(B, 8, stored={M: 0.1}), peer(C, 64)])
    clock = Clock()
    r, scheduler = spreading(peers, busy=6, clock=clock, replica_after=2.0)
    assert await r.decide(M, Intent.INFER, Origin()) == Local()  # saturated from now
    clock.now += 1.5
    assert await r.decide(M, Intent.INFER, Origin()) == Local()
    scheduler.busy[M] = 2
    clock.now += 1
    assert await r.decide(M, Intent.INFER, Origin()) == Local()  # a spare slot: the period starts over
    scheduler.busy[M] = 6
    assert await r.decide(M, Intent.INFER, Origin()) == Local()
    clock.now += 1.5
    assert await r.decide(M, Intent.INFER, Origin()) == Local()
    clock.now += 1
    # B stores it and it fits: the new copy goes there (C has more room, but would copy it first).
    decision = await r.decide(M, Intent.INFER, Origin())
    assert decision == Forward((Target(B), Target(C, "http://*:17434", DIGEST)), Local())
    # B now shows its copy loading, every slot taken: a third copy waits for another whole period.
    peers.views[0] = loaded_peer(B, busy=5)
    clock.now += 1.5
    assert await r.decide(M, Intent.INFER, Origin()) == Forward((Target(B),), Local())  # the less busy
    clock.now += 1
    to_c = Target(C, "http://*:17434", DIGEST)
    assert await r.decide(M, Intent.INFER, Origin()) == Forward((to_c, Target(B)), Local())


async def test_spread_loaded_never_loads_another_copy() -> None:
    clock = Clock()
    r, _ = spreading(FixedPeers([peer(B, 8, stored={M: 0.1})]), busy=6, clock=clock, spread="loaded",
                     replica_after=0)
    clock.now += 60
    assert await r.decide(M, Intent.INFER, Origin()) == Local()


@pytest.mark.parametrize(("max_replicas", "expected"), [
    (1, Local()), (2, Forward((Target(B),), Local())), (0, Forward((Target(B),), Local()))])
async def test_max_replicas_caps_the_copies_in_the_pool(max_replicas: int, expected: Forward | Local) -> None:
    r, _ = spreading(FixedPeers([peer(B, 8, stored={M: 0.1})]), busy=6, replica_after=0,
                     max_replicas=max_replicas)
    assert await r.decide(M, Intent.INFER, Origin()) == expected


async def test_a_replica_target_copies_from_the_peer_that_stores_it() -> None:
    peers = FixedPeers([loaded_peer(B, busy=9), peer(C, 4)])
    r, _ = spreading(peers, stored=False, replica_after=0)  # neither stores it: the most room, here
    assert await r.decide(M, Intent.INFER, Origin()) == Local(PullSource(B, "peer-key"))
    assert (await r.decide(M, Intent.INFER, Origin(), tried=frozenset({"local"}))
            == Forward((Target(C, B.client_url()), Target(B)), Local()))


async def test_a_fallback_node_is_chosen_only_when_the_others_cannot_serve() -> None:
    fallback = loaded_peer(C, busy=0, fallback=True)
    r, _ = spreading(FixedPeers([loaded_peer(B, busy=2), fallback]), busy=4)
    assert await r.decide(M, Intent.INFER, Origin()) == Forward((Target(B), Target(C)), Local())
    r, _ = spreading(FixedPeers([loaded_peer(B, busy=6), fallback]), busy=6)  # the primaries saturated
    assert await r.decide(M, Intent.INFER, Origin()) == Forward((Target(C),), Local())
    r, _ = spreading(FixedPeers([fallback]), busy=6)  # B is down
    assert await r.decide(M, Intent.INFER, Origin()) == Forward((Target(C),), Local())


async def test_this_fallback_node_hands_its_requests_to_a_primary_with_a_spare_slot() -> None:
    peers = FixedPeers([loaded_peer(B, busy=1)])
    r, _ = spreading(peers, busy=0, fallback=True)
    assert await r.decide(M, Intent.INFER, Origin()) == Forward((Target(B),), Local())
    r, _ = spreading(FixedPeers([loaded_peer(B, busy=9)]), busy=0, fallback=True)
    assert await r.decide(M, Intent.INFER, Origin()) == Local()


async def test_a_draining_node_forwards_to_a_peer_that_can_serve_and_serves_only_when_none_can() -> None:
    r, _ = spreading(FixedPeers([peer(B, 8, stored={M: 0.1})]), busy=0, draining=True)
    assert await r.decide(M, Intent.INFER, Origin()) == Forward((Target(B),), Local())
    r, _ = spreading(FixedPeers([]), busy=0, draining=True)
    assert await r.decide(M, Intent.INFER, Origin()) == Local()
    r, _ = spreading(FixedPeers([loaded_peer(B, state="draining")]), busy=9)
    assert await r.decide(M, Intent.INFER, Origin()) == Local()


async def test_a_copy_being_stopped_is_not_chosen_when_another_can_take_it() -> None:
    r, _ = spreading(FixedPeers([loaded_peer(B, busy=2)]), busy=0, stopping=True)
    assert await r.decide(M, Intent.INFER, Origin()) == Forward((Target(B),), Local())
    r, _ = spreading(FixedPeers([loaded_peer(B, busy=0, draining=True), peer(C, 8)]), busy=6)
    assert await r.decide(M, Intent.INFER, Origin()) == Local()


async def test_a_conversation_stays_on_its_node_while_that_node_is_the_better_or_no_worse_place() -> None:
    views = [loaded_peer(B, busy=1)]
    clock = Clock()
    r, scheduler = spreading(FixedPeers(views), busy=4, clock=clock)
    assert await r.decide(M, Intent.INFER, Origin(), conversation="k") == Forward((Target(B),), Local())
    scheduler.busy[M] = 0
    clock.now += 1
    assert await r.decide(M, Intent.INFER, Origin(), conversation="other") == Local()
    assert await r.decide(M, Intent.INFER, Origin(), conversation="k") == Forward((Target(B),), Local())
    views[0] = loaded_peer(B, busy=4)  # every slot on B busy, none waiting, and none spare here either
    scheduler.busy[M] = 4
    clock.now += 1
    assert await r.decide(M, Intent.INFER, Origin(), conversation="k") == Forward((Target(B),), Local())
    assert await r.decide(M, Intent.INFER, Origin(), conversation="new") == Local()  # a tie stays local
    clock.now += 1
    scheduler.busy[M] = 3  # a spare slot here while B has none: the turn moves here, and stays
    assert await r.decide(M, Intent.INFER, Origin(), conversation="k") == Local()
    views[0] = loaded_peer(B, busy=0)
    scheduler.busy[M] = 4  # full here, a spare slot on B: the turn moves on rather than wait
    clock.now += 1
    assert await r.decide(M, Intent.INFER, Origin(), conversation="k") == Forward((Target(B),), Local())


async def test_a_saturated_node_loses_its_conversations() -> None:
    views = [loaded_peer(B, busy=1)]
    r, _ = spreading(FixedPeers(views), busy=5)
    assert await r.decide(M, Intent.INFER, Origin(), conversation="k") == Forward((Target(B),), Local())
    views[0] = loaded_peer(B, busy=6)
    assert await r.decide(M, Intent.INFER, Origin(), conversation="k") == Local()  # the less busy


async def test_a_conversation_is_not_followed_to_a_node_that_unloaded_or_went_away() -> None:
    views = [loaded_peer(B, busy=1)]
    r, _ = spreading(FixedPeers(views), busy=4)
    assert await r.decide(M, Intent.INFER, Origin(), conversation="k") == Forward((Target(B),), Local())
    views[0] = peer(B, 8, stored={M: 0.1})
    assert await r.decide(M, Intent.INFER, Origin(), conversation="k") == Local()
    views.clear()
    assert await r.decide(M, Intent.INFER, Origin(), conversation="k") == Local()


async def test_affinity_off_ignores_the_conversation() -> None:
    views = [loaded_peer(B, busy=1)]
    r, scheduler = spreading(FixedPeers(views), busy=4, affinity=False)
    assert await r.decide(M, Intent.INFER, Origin(), conversation="k") == Forward((Target(B),), Local())
    scheduler.busy[M] = 0
    assert await r.decide(M, Intent.INFER, Origin(), conversation="k") == Local()


async def test_tried_nodes_are_left_out_and_nothing_left_is_local() -> None:
    r, _ = spreading(FixedPeers([loaded_peer(B, busy=1), peer(C, 8)]), busy=0)
    to_c = Target(C, "http://*:17434", DIGEST)  # C copies it from this node
    assert await r.decide(M, Intent.INFER, Origin(), tried=frozenset({"local"})) \
        == Forward((Target(B), to_c), Local())
    assert await r.decide(M, Intent.INFER, Origin(), tried=frozenset({"local", peer_name(B)})) \
        == Forward((to_c,), Local())
    everything = frozenset({"local", peer_name(B), peer_name(C)})
    assert await r.decide(M, Intent.INFER, Origin(), tried=everything) == Local()


async def test_off_keeps_every_request_on_the_loaded_copy_however_busy() -> None:
    peers = FixedPeers([peer(B, 64, stored={M: 0.1})])
    r = router(peers, loaded={M: 0.1}, stored={M: 0.1})
    for _ in range(20):
        assert await r.decide(M, Intent.INFER, Origin()) == Local()
    assert peers.probes == 0
    r = router(FixedPeers([peer(B, 64, stored={M: 0.1}), loaded_peer(C, busy=50)]))
    decision = await r.decide(M, Intent.INFER, Origin())
    assert isinstance(decision, Forward) and decision.targets[0] == Target(C)


async def test_a_cold_burst_spreads_a_copy_per_node_once_each_has_a_whole_round_waiting() -> None:
    views = [peer(B, 8, stored={M: 0.1}), peer(C, 8, stored={M: 0.1})]
    peers = FixedPeers(views)
    r, _ = spreading(peers, stored=True, slots=4, replica_after=60)  # the period never passes here
    served = {"local": 0, peer_name(B): 0, peer_name(C): 0}
    for _ in range(24):  # decided at once: nothing reached any scheduler yet
        decision = await r.decide(M, Intent.INFER, Origin())
        name = "local" if isinstance(decision, Local) else decision.targets[0].name
        served[name] += 1
        if name != "local":  # the peer as this node counts it: a copy loading, its slots not known
            i = 0 if name == peer_name(B) else 1
            views[i] = replace(views[i], loaded={M: GB // 10},
                               models={M: ModelLoad(0, 0, served[name], loading=True)})
    assert served == {"local": 8, peer_name(B): 8, peer_name(C): 8}


async def test_a_small_burst_stays_on_one_copy() -> None:
    r, _ = spreading(FixedPeers([peer(B, 8, stored={M: 0.1})]), stored=True, slots=4, replica_after=60)
    for _ in range(7):
        assert await r.decide(M, Intent.INFER, Origin()) == Local()


async def test_an_unload_and_a_decision_made_afresh_ask_the_peers_now() -> None:
    peers = FixedPeers([loaded_peer(B, busy=1)])
    r, _ = spreading(peers, busy=4)
    await r.decide(M, Intent.INFER, Origin())
    await r.decide(M, Intent.SHOW, Origin())
    assert peers.asked_now == 0
    await r.decide(M, Intent.INFER, Origin(), fresh=True)
    await r.decide("docker.io/ai/other:1", Intent.UNLOAD, Origin())
    await router(peers).decide(M, Intent.INFER, Origin(), fresh=True)
    assert peers.asked_now == 3


def test_the_node_that_served_a_turn_keeps_the_conversation_and_off_remembers_none() -> None:
    r, _ = spreading(FixedPeers([]))
    r.served("conv", "127.0.0.12:17434")
    assert r.affinity.get("conv") == "127.0.0.12:17434"
    r.served(None, "local")  # no key: nothing to remember
    seed = router(FixedPeers([]))
    seed.served("conv", "local")
    assert seed.affinity.get("conv") is None
