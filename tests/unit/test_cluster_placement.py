"""Aggregation placement rules (docs/aggregation.md), table-tested, plus peer parsing and list merging."""

from __future__ import annotations

import pytest

from llmman.cluster.peers import parse_node, parse_peers
from llmman.cluster.placement import NodeView, model_size, place, rank
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
