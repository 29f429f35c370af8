"""Aggregation placement rules (docs/aggregation.md), table-tested, plus peer parsing and list merging."""

from __future__ import annotations

import pytest

from llmman.cluster.peers import parse_node, parse_peers
from llmman.cluster.placement import (
    ModelLoad,
    NodeView,
    backlogged_everywhere,
    copies,
    model_size,
    place,
    rank,
    rank_off,
    rank_spread,
    saturated_everywhere,
    slot_guess,
)
from llmman.cluster.views import merge
from llmman.config.table import split_list
from llmman.errors import ConfigError

GB = 10**9
M = "docker.io/ai/qwen3.5:0.8b"
BIG = "docker.io/ai/gemma4:latest"


def node(name: str, memory_gb: float, loaded: dict[str, float] | None = None,
         stored: dict[str, float] | None = None) -> NodeView:
    return NodeView(name, int(memory_gb * GB), {k: int(v * GB) for k, v in (loaded or {}).items()},
                    {k: int(v * GB) for k, v in (stored or {}).items()})


# The seed's three machines: a 38 GB Mac (this node), a 128 GB Spark, an 8 GB Asahi box.
CASES = [
    ("all store it, cold: most room among stored", [
        node("local", 38, stored={M: 1}), node("spark", 128, stored={M: 1}), node("asahi", 8, stored={M: 1})],
     M, "spark"),
    ("only the Mac stores it: stays although Spark has more room", [
        node("local", 38, stored={M: 1}), node("spark", 128), node("asahi", 8)], M, "local"),
    ("loaded on the small box: never a second copy", [
        node("local", 38, stored={M: 1}), node("spark", 128, stored={M: 1}),
        node("asahi", 8, loaded={M: 1}, stored={M: 1})], M, "asahi"),
    ("stored but does not fit: most room instead", [
        node("local", 38, loaded={BIG: 37}, stored={M: 8}), node("spark", 128)], M, "spark"),
    ("stored nowhere: most room", [node("local", 38), node("spark", 128), node("asahi", 8)], M, "spark"),
    ("ties go to this node", [node("local", 64), node("spark", 64)], M, "local"),
    ("ties among stored go to this node", [
        node("local", 64, stored={M: 1}), node("spark", 64, stored={M: 1})], M, "local"),
    ("unknown memory fits anything but ranks last on room", [
        node("local", 0), node("spark", 16)], M, "spark"),
    ("unknown memory with it stored beats room without", [
        node("local", 0, stored={M: 1}), node("spark", 128)], M, "local"),
    ("loaded wins over stored and room", [
        node("local", 128, stored={M: 1}), node("spark", 8, loaded={M: 1})], M, "spark"),
    ("names match case-insensitively", [
        node("local", 8), node("spark", 16, loaded={M.upper(): 1})], M, "spark"),
    ("nothing fits anywhere: most room", [
        node("local", 4, stored={BIG: 60}), node("spark", 32)], BIG, "spark"),
    ("alone", [node("local", 0)], M, "local"),
]


@pytest.mark.parametrize(("nodes", "ref", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_place(nodes: list[NodeView], ref: str, expected: str) -> None:
    assert place(ref, nodes).name == expected


def test_rank_lists_every_node_for_fallback() -> None:
    nodes = [node("local", 38, stored={M: 1}), node("spark", 128, stored={M: 1}), node("asahi", 8)]
    assert [n.name for n in rank(M, model_size(M, nodes), nodes)] == ["spark", "local", "asahi"]


def test_free_is_memory_less_loaded() -> None:
    assert node("x", 10, loaded={M: 3, BIG: 4}).free == 3 * GB
    assert node("x", 1, loaded={BIG: 4}).free == 0


def test_parse_peers_like_llmman_host() -> None:
    peers = parse_peers(split_list(" asahi, spark:9000 ,https://10.0.0.5, ,http://[::1]"))
    assert [str(p) for p in peers] == ["http://asahi:17434", "http://spark:9000", "https://10.0.0.5:443",
                                       "http://[::1]:80"]
    assert parse_peers(split_list("")) == ()
    with pytest.raises(ConfigError, match=r"aggregation\.peers"):
        parse_peers(split_list("ftp://x"))


def test_parse_node_rejects_garbage() -> None:
    good = {"memory": 5, "loaded": {"a": 1}, "stored": {}, "free": 4}
    assert parse_node("p", "u", good) == NodeView("p", 5, {"a": 1}, {}, "u")
    for bad in ([], {"memory": "5", "loaded": {}, "stored": {}}, {"memory": 5, "loaded": {"a": "1"},
                                                                  "stored": {}}, {"memory": 1}):
        assert parse_node("p", "u", bad) is None


def test_merge_names_nodes_and_dedupes_lists() -> None:
    local = {"models": [{"name": "a"}]}
    remote = [("spark:17434", {"models": [{"name": "a"}, {"name": "b"}]}), ("x:1", {"oops": 1})]
    assert merge("/api/tags", local, remote) == {
        "models": [{"name": "a", "node": "local"}, {"name": "b", "node": "spark:17434"}]}
    assert merge("/api/ps", local, remote)["models"][1] == {"name": "a", "node": "spark:17434"}
    assert merge("/api/ps", local, []) == local
    v1 = merge("/v1/models", {"object": "list", "data": [{"id": "a"}]}, [("s:1", {"data": [{"id": "c"}]})])
    assert [e["id"] for e in v1["data"]] == ["a", "c"]


# --- Spreading (rank_spread, rank_off's fallback and draining rules) ----------------------------------------

def copy(name: str, slots: int = 4, busy: int = 0, *, fallback: bool = False, state: str = "serving",
         draining: bool = False, memory_gb: float = 8, ref: str = M) -> NodeView:
    """A node with ``ref`` loaded (1 GB) in ``slots`` slots, ``busy`` requests on it (the rest queued)."""
    served = min(busy, slots)
    return NodeView(name, int(memory_gb * GB), {ref: GB}, {ref: GB}, state=state, fallback=fallback,
                    models={ref: ModelLoad(slots, served, busy - served, draining=draining)})


def bare(name: str, memory_gb: float = 8, *, stored: bool = True, fallback: bool = False,
         state: str = "serving") -> NodeView:
    """A node without a copy, storing ``M`` (1 GB) or not."""
    return NodeView(name, int(memory_gb * GB), {}, {M: GB} if stored else {}, state=state, fallback=fallback)


SPREAD_CASES = [
    ("a spare slot here stays here", [copy("local", busy=3), copy("b", busy=0)], False, False,
     ["local", "b"]),
    ("full here: the loaded peer with the most spare slots", [
        copy("local", busy=4), copy("b", busy=3), copy("c", busy=1)], False, False, ["c", "b", "local"]),
    ("full here, fill: the first peer with a spare slot (stable order)", [
        copy("local", busy=4), copy("b", busy=3), copy("c", busy=1)], True, False, ["b", "c", "local"]),
    ("none has spare: least busy for its slots, ties local", [
        copy("local", busy=6), copy("b", 2, busy=4), copy("c", busy=6)], False, False, ["local", "c", "b"]),
    ("no new copy while one is loaded, even with room elsewhere", [
        copy("local", busy=8), bare("b", 64)], False, False, ["local", "b"]),
    ("another copy due: the node that stores it and fits, before the saturated one", [
        copy("local", busy=8), bare("b", 64, stored=False), bare("c", 8)], True, True, ["c", "b", "local"]),
    ("another copy due but it fits nowhere: queue on the loaded copy", [
        copy("local", busy=8), bare("b", 0.5)], True, True, ["local", "b"]),
    ("cold: the seed's rules 2 and 3", [bare("local", 8, stored=False), bare("b", 16), bare("c", 32)],
     False, False, ["c", "b", "local"]),
    ("cold, ties stay local", [bare("local", 16), bare("b", 16)], False, False, ["local", "b"]),
    ("a fallback copy with spare only after the primaries' spare slots", [
        copy("local", busy=1, fallback=True), copy("b", busy=2)], False, False, ["b", "local"]),
    ("a fallback copy with spare before saturated primaries", [
        copy("local", busy=9), copy("f", busy=0, fallback=True)], False, False, ["f", "local"]),
    ("cold: a fallback node only after the primaries with room", [
        bare("f", 128, fallback=True), bare("local", 8), bare("b", 16)], False, False, ["b", "local", "f"]),
    ("cold: the fallback when no primary has room", [
        bare("local", 0.5), bare("f", 8, fallback=True)], False, False, ["f", "local"]),
    ("loaded only on a fallback: a primary with room loads it", [
        copy("f", busy=0, fallback=True), bare("local", 8)], False, False, ["local", "f"]),
    ("a draining node comes last, even with the only copy", [
        copy("local", busy=0, state="draining"), bare("b", 8)], False, False, ["b", "local"]),
    ("a copy being stopped comes last", [copy("local", busy=0, draining=True), copy("b", busy=3)],
     False, False, ["b", "local"]),
    ("only draining nodes: still ranked (one serves rather than none)", [
        copy("local", busy=0, state="draining"), bare("b", 8, state="draining")], False, False,
     ["local", "b"]),
    ("an older node that publishes no load counts as one free slot", [
        copy("local", busy=4), NodeView("old", 8 * GB, {M: GB}, {M: GB})], False, False, ["old", "local"]),
]


@pytest.mark.parametrize(("nodes", "fill", "replica", "expected"), [c[1:] for c in SPREAD_CASES],
                         ids=[c[0] for c in SPREAD_CASES])
def test_rank_spread(nodes: list[NodeView], fill: bool, replica: bool, expected: list[str]) -> None:
    ranked = rank_spread(M, model_size(M, nodes), nodes, fill=fill, replica=replica)
    assert [n.name for n in ranked] == expected


def test_saturated_everywhere_counts_the_primary_copies_that_take_requests() -> None:
    assert saturated_everywhere(M, [copy("local", busy=5), copy("b", 2, busy=3)])
    assert not saturated_everywhere(M, [copy("local", busy=5), copy("b", busy=4)])  # b full, none waiting
    assert not saturated_everywhere(M, [copy("local", busy=5), copy("b", busy=1)])
    assert not saturated_everywhere(M, [bare("local")])  # no copy: nothing to be saturated
    assert saturated_everywhere(M, [copy("local", busy=5), copy("f", busy=0, fallback=True)])
    assert saturated_everywhere(M, [copy("local", busy=5), copy("b", busy=0, state="draining")])
    assert copies(M, [copy("local"), copy("b", draining=True), copy("c", state="draining"), bare("d")]) == 1


OFF_CASES = [
    ("no fallback and nothing draining: the seed's ranking", [
        node("local", 38, stored={M: 1}), node("spark", 128, stored={M: 1}), node("asahi", 8)],
     ["spark", "local", "asahi"]),
    ("a fallback node with the copy goes after a primary with room", [
        NodeView("f", 8 * GB, {M: GB}, {M: GB}, fallback=True), node("local", 8)], ["local", "f"]),
    ("a fallback node stays first when no primary has room", [
        NodeView("f", 8 * GB, {M: GB}, {M: GB}, fallback=True), node("local", 0.5, loaded={BIG: 0.4})],
     ["f", "local"]),
    ("a draining node goes last", [NodeView("b", 8 * GB, {M: GB}, {M: GB}, state="draining"),
                                   node("local", 8)], ["local", "b"]),
]


@pytest.mark.parametrize(("nodes", "expected"), [c[1:] for c in OFF_CASES], ids=[c[0] for c in OFF_CASES])
def test_rank_off(nodes: list[NodeView], expected: list[str]) -> None:
    assert [n.name for n in rank_off(M, model_size(M, nodes), nodes)] == expected


def test_rank_spread_fails_over_to_a_fallback_with_room_before_a_primary_without() -> None:
    nodes = [bare("local", 0.5, stored=False), copy("p"), bare("f", 64, fallback=True)]
    assert [n.name for n in rank_spread(M, GB, nodes, fill=True, replica=False)] == ["p", "f", "local"]


def test_backlogged_everywhere_wants_a_whole_round_waiting_on_every_primary_copy() -> None:
    assert backlogged_everywhere(M, [copy("local", busy=8), copy("b", 2, busy=4)])
    assert not backlogged_everywhere(M, [copy("local", busy=8), copy("b", 2, busy=3)])
    assert not backlogged_everywhere(M, [bare("local")])
    unknown = NodeView("b", 8 * GB, {M: GB}, {M: GB}, models={M: ModelLoad(0, 0, 5, loading=True)})
    assert slot_guess(M, [copy("local", busy=8), unknown]) == 4  # b's slots taken to be local's
    assert not backlogged_everywhere(M, [copy("local", busy=8), unknown])
