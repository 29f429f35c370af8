"""The router's decision (cluster/router.py), table-tested on snapshots: which node serves, what it copies
from, which peers a forward tries in order, and what a forwarded request's source header may name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp
import pytest

from llmman.cluster.copy import PullSource
from llmman.cluster.peers import Peers, peer_name
from llmman.cluster.placement import NodeView
from llmman.cluster.router import Forward, Intent, Local, Origin, Router, Target
from llmman.config.table import HostAddress
from llmman.sched.scheduler import Scheduler
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


@dataclass
class Stored:
    reference: str
    size: int
    digest: str = DIGEST


@dataclass
class FakeScheduler:
    """What a router reads of the scheduler: what is loaded, the capacity, the queue, the node state."""

    capacity: int
    loaded: Mapping[str, int] = field(default_factory=dict)
    draining: bool = False

    def snapshot(self) -> list[Snap]:
        return [Snap(ref, size) for ref, size in self.loaded.items()]

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
        self.marked: list[str] = []

    async def probe(self) -> list[NodeView]:
        self.probes += 1
        return [v for v in self.views if v.name not in self.marked]

    def mark_down(self, address: HostAddress, why: str) -> None:
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
    return Router(peers, cast(Scheduler, scheduler), cast(Store, store), OWN, {})


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
    assert first == Forward((Target(B),), Local(PullSource(B, "peer-key")))
    again = await r.decide("smollm2:135m", Intent.INFER, Origin())
    assert again == Forward((Target(B),), otherwise=None) and peers.probes == 1
    fresh = await r.decide("smollm2:135m", Intent.INFER, Origin(), fresh=True)
    assert fresh == first and peers.probes == 2


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
    assert await r.decide(M, intent, Origin()) == Forward((Target(B),), Local())
    assert peers.recent.get(M) is None


async def test_unload_of_a_model_loaded_nowhere_goes_to_a_node_storing_it() -> None:
    peers = FixedPeers([peer(B, 8, stored={M: 0.1})])
    assert await router(peers).decide(M, Intent.UNLOAD, Origin()) == Forward((Target(B),), Local())
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
