"""The split rule and plan (llmman.cluster.split): when a model is split, and the shares, flags and 507."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmman.api.inference import moves_on, refused
from llmman.cluster.placement import LOCAL, ModelLoad, NodeView
from llmman.cluster.split import Costs, costs_of, needs_split, plan_split
from llmman.errors import LlmmanError
from llmman.gguf import read_gguf
from llmman.sched.memory import estimate

MB = 1_000_000
GEMMA = Path.home() / ".cache/llmman/models/gemma-3-270m-q4_k_m.gguf"


def node(name: str, memory: int, *, loaded: int = 0, reserved: int = 0, lends: bool = True,
         state: str = "serving") -> NodeView:
    return NodeView(name, memory, {"other:1": loaded} if loaded else {}, {}, "" if name == LOCAL
                    else f"http://{name}", node=f"n-{name}", state=state, reserved=reserved, lends=lends)


# -- the rule ---------------------------------------------------------------------------------------

def test_auto_splits_only_when_no_node_holds_it() -> None:
    nodes = [node(LOCAL, 250 * MB), node("b:1", 250 * MB), node("c:1", 250 * MB)]
    assert needs_split(300 * MB, nodes, None)
    assert needs_split(300 * MB, nodes, "auto")
    assert not needs_split(200 * MB, nodes, None)  # fits one node: never split
    bigger = [*nodes, node("d:1", 400 * MB, loaded=390 * MB)]
    assert not needs_split(300 * MB, bigger, None)  # capacity counts, not what is free now


def test_no_lender_no_split() -> None:
    nodes = [node(LOCAL, 250 * MB), node("b:1", 250 * MB, lends=False),
             node("c:1", 250 * MB, state="draining")]
    assert not needs_split(300 * MB, nodes, None)  # it loads, or fails, as before


def test_unknown_memory_fits_anything() -> None:
    assert not needs_split(300 * MB, [node(LOCAL, 250 * MB), node("b:1", 0)], None)
    assert not needs_split(0, [node(LOCAL, 250 * MB)], None)


def test_preset_forces_or_forbids() -> None:
    small = [node(LOCAL, 250 * MB), node("b:1", 250 * MB)]
    assert not needs_split(300 * MB, small, "never")
    big = [node(LOCAL, 4000 * MB), node("b:1", 4000 * MB)]
    assert needs_split(300 * MB, big, "always")
    assert not needs_split(300 * MB, [node(LOCAL, 4000 * MB), node("b:1", 4000 * MB, lends=False)], "always")
    assert not needs_split(300 * MB, [node(LOCAL, 4000 * MB)], "always")  # nobody lends: loaded whole


# -- the plan ---------------------------------------------------------------------------------------

COSTS = Costs(head=100 * MB, layers=(10 * MB,) * 10, compute=20 * MB)


def test_shares_follow_room_this_node_first() -> None:
    plan = plan_split("m:1", COSTS, node(LOCAL, 150 * MB),
                      [node("b:1", 70 * MB), node("c:1", 120 * MB), node("x:1", 500 * MB, lends=False)])
    # room beyond the fixed parts: this node 50, c 100, b 50 (most room first); 100 MB of layers
    assert [s.node for s in plan.shares] == [LOCAL, "c:1", "b:1"]
    assert [s.layers for s in plan.shares] == [3, 5, 2]
    assert sum(s.layers for s in plan.shares) == 10
    assert plan.local.memory == 100 * MB + plan.local.layers * 10 * MB
    for worker in plan.workers:
        assert worker.memory == 20 * MB + worker.layers * 10 * MB
        assert worker.url == f"http://{worker.node}"
        assert worker.label == f"n-{worker.node}"
    for share, room in zip(plan.shares, (150, 120, 70), strict=True):
        assert share.memory <= room * MB


def test_free_memory_counts_loaded_and_reserved() -> None:
    plan = plan_split("m:1", COSTS, node(LOCAL, 200 * MB, loaded=50 * MB),
                      [node("b:1", 300 * MB, reserved=200 * MB), node("c:1", 300 * MB, loaded=150 * MB)])
    by = {s.node: s for s in plan.shares}
    assert by[LOCAL].memory <= 150 * MB and by["b:1"].memory <= 100 * MB and by["c:1"].memory <= 150 * MB
    assert sum(s.layers for s in plan.shares) == 10


def test_idle_models_count_as_room_only_when_free_memory_is_not_enough() -> None:
    idle = {"idle:1": ModelLoad(slots=1)}
    busy = {"busy:1": ModelLoad(slots=1, in_flight=1)}
    b = NodeView("b:1", 300 * MB, {"idle:1": 150 * MB}, {}, "http://b:1", models=idle, lends=True)
    c = NodeView("c:1", 300 * MB, {"busy:1": 100 * MB}, {}, "http://c:1", models=busy, lends=True)
    plan = plan_split("m:1", COSTS, node(LOCAL, 150 * MB), [b, c])
    assert {w.node: w.memory for w in plan.workers}["b:1"] <= 150 * MB  # fits in free memory: no eviction
    tight = plan_split("m:1", Costs(head=100 * MB, layers=(50 * MB,) * 7, compute=20 * MB),
                       node(LOCAL, 150 * MB), [b, c])
    by = {w.node: w.memory for w in tight.workers}
    assert by["b:1"] > 150 * MB and by["b:1"] <= 300 * MB  # b's idle model unloads for its worker
    assert by["c:1"] <= 200 * MB  # c's busy model stays
    with pytest.raises(LlmmanError) as caught:
        plan_split("m:1", Costs(head=100 * MB, layers=(50 * MB,) * 10, compute=20 * MB),
                   node(LOCAL, 150 * MB), [b, c])
    assert "idle models unloaded" in caught.value.message


def test_rounding_never_overfills_a_node() -> None:
    costs = Costs(head=10 * MB, layers=(9 * MB, 9 * MB, 9 * MB), compute=1 * MB)
    # rooms 10+9 / 1+9 / 1+9: proportional boundaries would round a layer onto a node without room for it
    plan = plan_split("m:1", costs, node(LOCAL, 19 * MB), [node("b:1", 10 * MB), node("c:1", 10 * MB)])
    assert [s.layers for s in plan.shares] == [1, 1, 1]
    assert all(s.memory <= 19 * MB for s in plan.shares)


def test_workers_without_layers_are_left_out() -> None:
    plan = plan_split("m:1", COSTS, node(LOCAL, 195 * MB), [node("b:1", 36 * MB), node("c:1", 21 * MB)])
    assert [s.layers for s in plan.shares] == [9, 1]
    assert all(w.layers > 0 for w in plan.workers)
    assert sum(s.layers for s in plan.shares) == 10


def test_draining_and_non_lending_peers_get_nothing() -> None:
    plan = plan_split("m:1", COSTS, node(LOCAL, 150 * MB),
                      [node("b:1", 500 * MB, state="draining"), node("c:1", 500 * MB, lends=False),
                       node("d:1", 100 * MB)])
    assert [w.node for w in plan.workers] == ["d:1"]


def test_pool_too_small_is_507_naming_what_is_missing() -> None:
    with pytest.raises(LlmmanError) as caught:
        plan_split("m:1", COSTS, node(LOCAL, 120 * MB), [node("b:1", 50 * MB)])
    assert caught.value.status == 507 and caught.value.code == "insufficient_memory"
    # layers 100 MB; room for them 20 (this node) + 30 (b) = 50
    assert "lacks 50.0 MB (50000000 B)" in caught.value.message and "1 peer(s)" in caught.value.message


def test_head_must_fit_this_node() -> None:
    with pytest.raises(LlmmanError) as caught:
        plan_split("m:1", COSTS, node(LOCAL, 90 * MB), [node("b:1", 5000 * MB)])
    # this node's own shortfall: 500, so the request moves on to a node that may hold the head
    assert caught.value.status == 500 and "keeps the embeddings" in caught.value.message
    assert moves_on(caught.value)


def test_a_pool_too_small_is_507_and_stays_on_this_node() -> None:
    with pytest.raises(LlmmanError) as caught:
        plan_split("m:1", COSTS, node(LOCAL, 110 * MB), [node("b:1", 30 * MB)])
    assert caught.value.status == 507 and "it still lacks" in caught.value.message
    assert not moves_on(caught.value) and not refused(507) and refused(500)


# -- a real model ----------------------------------------------------------------------------------

@pytest.mark.skipif(not GEMMA.is_file(), reason="run scripts/setup.sh --model (Gemma 3 270M)")
def test_costs_of_gemma_add_up_to_the_estimate() -> None:
    info = read_gguf(GEMMA)
    costs = costs_of(info, n_ctx=4096)
    assert costs.total == estimate(info, n_ctx=4096).total
    assert len(costs.layers) == info.block_count == 18
    # the 262k-token embedding stays on this node: most of the model is its head
    assert costs.head > 178 * 1024 * 1024
    # every 6th layer is full attention: its KV cache is larger than a sliding-window layer's
    assert costs.layers[5] > costs.layers[4] - 1_000_000 and costs.layers[5] != costs.layers[4]
    plan = plan_split("gemma3:270m", costs, node(LOCAL, 250 * MB),
                      [node("b:1", 250 * MB), node("c:1", 250 * MB)])
    assert sum(s.layers for s in plan.shares) == 18
    assert all(s.memory <= 250 * MB for s in plan.shares)
    assert sum(s.memory for s in plan.shares) == costs.total + costs.compute * len(plan.workers)
