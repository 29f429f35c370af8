"""``GET /llmman/pool`` (api/pool_view.py) and the ``llmman nodes`` table (cli/tables.py ``nodes_table``):
the entries from node views and peer states, a node without peers answering itself alone, the table."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.inprocess import InProcessApp

from llmman import __version__
from llmman.api.pool_view import node_entry, peer_entry
from llmman.cli.tables import nodes_table
from llmman.cluster.peers import PeerState, Sighting
from llmman.cluster.placement import ModelLoad, NodeView
from llmman.config.table import HostAddress

REF = "docker.io/ai/smollm2:135m"
B = HostAddress("http", "127.0.0.2", 17434)
GB = 10**9


def spark(**kw: object) -> NodeView:
    base: dict[str, object] = {
        "name": "127.0.0.2:17434", "memory": 8 * GB, "loaded": {REF: 2 * GB}, "stored": {REF: 2 * GB, "x": 1},
        "node": "spark", "models": {REF: ModelLoad(4, 3, 1, draining=False)}}
    base.update(kw)
    return NodeView(**base)  # type: ignore[arg-type]


def test_an_up_peer_shows_its_own_figures_name_and_version() -> None:
    entry = peer_entry(PeerState(B, Sighting(spark(), "0.9.1", 10.0, 3), 1.23456, None, 2))
    assert entry == {
        "name": "spark", "address": "127.0.0.2:17434", "self": False, "state": "up", "why": "",
        "unresponsive": False, "fallback": False, "version": "0.9.1", "last_seen": 1.235, "memory": 8 * GB,
        "free": 6 * GB,
        "models": {REF: {"slots": 4, "in_flight": 3, "queued": 1, "loading": False, "draining": False,
                         "size": 2 * GB}},
        "stored": 2, "rpc": {"serve": False, "reserved": 0, "workers": 0}, "forwarded": 2}


def test_a_draining_or_fallback_node_says_so() -> None:
    entry = peer_entry(PeerState(B, Sighting(spark(state="draining", fallback=True), "1", 0, 0), 0.0,
                                 None, 0))
    assert (entry["state"], entry["fallback"]) == ("draining", True)


def test_a_down_peer_keeps_its_name_but_shows_no_load() -> None:
    entry = peer_entry(PeerState(B, Sighting(spark(), "0.9.1", 10.0, 3), 42.0, "connection refused", 0))
    assert (entry["name"], entry["state"], entry["why"], entry["last_seen"]) == \
        ("spark", "down", "connection refused", 42.0)
    assert (entry["memory"], entry["free"], entry["models"], entry["stored"]) == (0, 0, {}, 0)
    never = peer_entry(PeerState(B, None, None, "TimeoutError", 0))
    assert (never["name"], never["version"], never["last_seen"], never["state"]) == ("", "", None, "down")


def test_an_unresponsive_peer_is_down_but_keeps_what_it_was_seen_holding() -> None:
    seen = Sighting(spark(), "0.9.1", 10.0, 3)
    slow = peer_entry(PeerState(B, seen, 7.0, "TimeoutError: no answer in 3 s", 1, unresponsive=True))
    dead = peer_entry(PeerState(B, seen, 7.0, "connection refused", 1))
    assert slow["state"] == dead["state"] == "down"
    assert (slow["unresponsive"], dead["unresponsive"]) == (True, False)
    assert slow["models"] == peer_entry(PeerState(B, seen, 7.0, None, 1))["models"] and slow["models"]
    assert slow["memory"] > 0 and dead["models"] == {} and dead["memory"] == 0


def test_this_node_is_marked_self() -> None:
    entry = node_entry(spark(name="local"), name="mine", address="0.0.0.0:17434", own=True,
                       version="1.0", last_seen=0.0)
    assert entry["self"] is True and entry["name"] == "spark" and entry["state"] == "up"
    unnamed = node_entry(spark(node=""), name="mine", address="h:1", own=True, version="1.0", last_seen=0.0)
    assert unnamed["name"] == "mine"


def test_a_node_without_peers_answers_itself_alone(tmp_path: Path) -> None:
    with InProcessApp(tmp_path, env={"LLMMAN_NODE_NAME": "solo", "LLMMAN_FALLBACK": "1"},
                      names=("tiny", "other")) as app:
        r = app.request("GET", "/llmman/pool")
        assert r.status_code == 200, r.text
        [me] = r.json()["nodes"]
        assert (me["name"], me["self"], me["state"], me["version"], me["fallback"]) == \
            ("solo", True, "up", __version__, True)
        assert (me["address"], me["last_seen"], me["stored"], me["models"]) == ("127.0.0.1:1", 0.0, 2, {})


def test_the_nodes_table() -> None:
    nodes = [
        peer_entry(PeerState(B, Sighting(spark(), "1", 0, 0), 0.2, None, 0)) | {"self": True},
        peer_entry(PeerState(HostAddress("http", "c", 1), Sighting(spark(
            node="c", memory=0, loaded={}, models={}, fallback=True, state="draining"), "1", 0, 0), 75.0,
            None, 0)),
        peer_entry(PeerState(HostAddress("http", "d", 2), None, None, "Cannot connect to host d:2", 0)),
        peer_entry(PeerState(HostAddress("http", "e", 3), Sighting(spark(
            node="e", models={REF: ModelLoad(0, 0, 2, loading=True)}), "1", 0, 0), 5.0, None, 0)),
    ]
    lines = nodes_table(nodes).splitlines()
    cells = [[line[i:j].strip() for i, j in zip(STARTS, [*STARTS[1:], None], strict=True)] for line in lines]
    assert cells == [
        ["NODE", "ADDRESS", "STATE", "MEMORY", "MODELS", "LAST SEEN"],
        ["spark (this node)", "127.0.0.2:17434", "up", "2.0 GB/8.0 GB", f"{REF} 3/4, 1 queued", "now"],
        ["c", "c:1", "draining, fallback", "unknown", "", "1 minute ago"],
        ["?", "d:2", "down: Cannot connect to host d:2", "", "", "never"],
        ["e", "e:3", "up", "2.0 GB/8.0 GB", f"{REF} 0/?, 2 queued, loading", "5s ago"],
    ]
    assert [lines[0].index(h) for h in ("NODE", "ADDRESS", "STATE", "MEMORY", "MODELS", "LAST SEEN")] \
        == list(STARTS)


STARTS = (0, 21, 40, 76, 93, 145)  # where each column starts: the widest cell plus four spaces


def test_a_lending_node_shows_its_workers_in_the_view_and_the_nodes_table() -> None:
    lender = peer_entry(PeerState(B, Sighting(spark(lends=True, reserved=100_900_000, lent=1, loaded={},
                                                    models={}), "1", 0, 0), 0.1, None, 0))
    assert lender["rpc"] == {"serve": True, "reserved": 100_900_000, "workers": 1}
    assert lender["free"] == 8 * GB - 100_900_000  # lent memory is taken, and now says by what
    table = nodes_table([lender])
    assert "1 RPC worker for a split 100.9 MB" in table, table
    two = lender | {"rpc": {"serve": True, "reserved": 3 * GB, "workers": 2}}
    assert "2 RPC workers for a split 3.0 GB" in nodes_table([two])
    assert "RPC" not in nodes_table([peer_entry(PeerState(B, Sighting(spark(), "1", 0, 0), 0.1, None, 0))])
