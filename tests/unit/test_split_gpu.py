"""A split whose main node has GPUs (llmman.cluster.split.on_gpus, plan_split(gpus=True), device_split,
llmman.cluster.split_runner.child_spec): this node's share goes on its GPUs, after the workers, as llama.cpp
orders its devices (RPC first, then local GPUs). No GPU here: the node is a NodeMemory of fake CUDA devices
and the test reads the plan and the argv (docs/split.md says it is untested on hardware); the last one goes
through the gateway and the scheduler's admission, with the stand-in lender of test_split_replan.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from tests.unit.test_split_replan import HERE, split_pool

from llmman.cluster.placement import LOCAL, NodeView
from llmman.cluster.split import Costs, device_split, local_parts, on_gpus, plan_split
from llmman.cluster.split_runner import child_spec
from llmman.daemon import launch_spec
from llmman.runner.argv import KEEP_LOCAL, build_argv
from llmman.sched.devices import Placement
from llmman.sched.gpu import Device, NodeMemory
from llmman.sched.plan import ModelPlan, Split

MB = 1_000_000
G = 10**9
COSTS = Costs(head=100 * MB, layers=tuple(10 * MB + i for i in range(10)), compute=20 * MB)


def gpus(kind: str = "cuda", n: int = 2) -> NodeMemory:
    return NodeMemory(kind, tuple(Device(kind, i, f"GPU{i}", 24 * G, 24 * G) for i in range(n)))


def peer(name: str, memory: int) -> NodeView:
    return NodeView(name, memory, {}, {}, f"http://{name}", node=f"n-{name}", lends=True)


def test_which_nodes_put_their_share_on_gpus() -> None:
    assert on_gpus(gpus("cuda"), None) and on_gpus(gpus("rocm"), 20) and on_gpus(gpus("metal", 1), None)
    assert not on_gpus(gpus("cuda"), 0)  # num_gpu 0 / gpu_layers 0: kept off the GPUs
    assert not on_gpus(NodeMemory("cpu", (Device("cpu", 0, "system RAM", 64 * G, 64 * G),)), None)
    assert not on_gpus(NodeMemory("cuda", ()), None) and not on_gpus(None, None)


def test_on_gpus_the_workers_take_the_first_layers_and_this_node_the_last() -> None:
    local, peers = NodeView(LOCAL, 160 * MB), [peer("b:1", 70 * MB), peer("c:1", 120 * MB)]
    cpu = plan_split("m:1", COSTS, local, peers)
    gpu = plan_split("m:1", COSTS, local, peers, gpus=True)
    assert [s.layers for s in gpu.shares] == [s.layers for s in cpu.shares] == [3, 5, 2]
    # the same counts, other layers: on its GPUs this node holds the last 3 (7, 8, 9)
    assert gpu.local.memory == COSTS.head + sum(COSTS.layers[7:])
    assert [w.memory for w in gpu.workers] == [20 * MB + sum(COSTS.layers[0:5]),
                                               20 * MB + sum(COSTS.layers[5:7])]
    assert cpu.local.memory == COSTS.head + sum(COSTS.layers[:3])
    # every layer offloaded, the output layer too; the output slot is this node's, not the last worker's
    assert gpu.n_gpu_layers == 11 and gpu.tensor_split == (5, 2) and gpu.local_slots == 4
    assert cpu.n_gpu_layers == 8 and cpu.tensor_split == (5, 3) and cpu.local_slots == 0


def test_the_local_slots_are_divided_over_the_gpus_in_the_childs_order() -> None:
    assert device_split((5, 2), 0, (1.0,)) == (5, 2)  # on the CPU: the workers only
    assert device_split((5, 2), 4, (1.0,)) == (5, 2, 4)
    assert device_split((5, 2), 4, (0.75, 0.25)) == (5, 2, 3, 1)
    assert device_split((5,), 5, (0.5, 0.5)) == (5, 3, 2)  # the largest remainder, the first on ties
    assert device_split((5,), 3, (0.0, 1.0, 0.0)) == (5, 0, 3, 0)  # a pinned GPU it does not use: 0
    assert sum(device_split((1,), 7, (0.2, 0.3, 0.5))[1:]) == 7


def test_local_parts_follow_where_admission_placed_the_share() -> None:
    assert local_parts(None, None) == (1.0,)  # Metal (one device), or no placement
    assert local_parts(Placement((1, 0), (0.75, 0.25)), None) == (0.75, 0.25)  # CUDA_VISIBLE_DEVICES=1,0
    assert local_parts(Placement((2,), (1.0,)), "0,2") == (0.0, 1.0)  # the pin's order, 0 for the unused
    assert local_parts(Placement((0,), (1.0,)), "GPU-uuid") == (1.0,)


def _plan(split: Split, placement: Placement | None = None, devices: str | None = None) -> ModelPlan:
    return ModelPlan(reference="docker.io/ai/big:1", digest="sha256:x", size=1, n_ctx=1024,
                     model_path="/blobs/big", placement=placement, devices=devices, split=split)


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize(("placement", "devices", "ts"), [
    (Placement((1, 0), (0.75, 0.25)), None, "5,2,3,1"),  # two GPUs, CUDA_VISIBLE_DEVICES=1,0
    (Placement((1,), (1.0,)), None, "5,2,4"),  # one of them
    (Placement((1,), (1.0,)), "0,1", "5,2,0,4"),  # pinned to both, placed on the second: never -sm none
])
def test_a_gpu_main_nodes_child_argv(placement: Placement, devices: str | None, ts: str) -> None:
    gpu = plan_split("m:1", COSTS, NodeView(LOCAL, 160 * MB), [peer("b:1", 70 * MB), peer("c:1", 120 * MB)],
                     gpus=True)
    split = Split(("10.0.0.2:50101", "10.0.0.3:50102"), gpu.n_gpu_layers, gpu.tensor_split, (),
                  local_slots=gpu.local_slots)
    plan = _plan(split, placement, devices)
    argv = build_argv("llama-server", child_spec(launch_spec(plan), plan), host="127.0.0.1", port=9)
    assert _flag(argv, "--rpc") == "10.0.0.2:50101,10.0.0.3:50102"
    assert _flag(argv, "-ngl") == "11" and _flag(argv, "-ts") == ts
    assert "-ot" not in argv  # the output head stays on this node's GPU; the input embedding is on its CPU
    assert "-sm" not in argv and "-mg" not in argv


def test_num_gpu_0_keeps_the_rpc_devices() -> None:
    split = Split(("10.0.0.2:50101", "10.0.0.3:50102"), 8, (5, 3), (), local_slots=0)
    plan = replace(_plan(split), n_gpu_layers=0, extra_args=("-t", "3", "-dev", "none", "--foo", "none"))
    argv = build_argv("llama-server", child_spec(launch_spec(plan), plan), host="127.0.0.1", port=9)
    # -dev none would drop the RPC devices too: only the workers, never this node's GPUs
    assert argv.count("-dev") == 1 and _flag(argv, "-dev") == "RPC0,RPC1"
    assert argv[argv.index("-t"):] == ["-t", "3", "--foo", "none", "-dev", "RPC0,RPC1"]
    assert _flag(argv, "-ngl") == "8" and _flag(argv, "-ts") == "5,3"


def test_a_cpu_main_nodes_child_argv_is_unchanged() -> None:
    split = Split(("10.0.0.2:50101",), 4, (4,), (), local_slots=0)
    plan = _plan(split)
    argv = build_argv("llama-server", child_spec(launch_spec(plan), plan), host="127.0.0.1", port=9)
    assert _flag(argv, "-ngl") == "4" and _flag(argv, "-ts") == "4" and _flag(argv, "-ot") == KEEP_LOCAL
    unsplit = ModelPlan(reference="x:1", digest="d", size=1, n_ctx=256, model_path="/m")
    assert child_spec(launch_spec(unsplit), unsplit) == launch_spec(unsplit)


async def test_the_gateway_plans_a_gpu_main_node_and_admission_places_its_share(tmp_path: Path) -> None:
    # two fake GPUs capped to HERE: the head (1.61 MB) fits this node, not one GPU's half of the cap
    node = NodeMemory("cuda", tuple(Device("cuda", i, f"GPU{i}", 24 * G, 24 * G) for i in range(2)), cap=HERE)
    async with split_pool(tmp_path, node) as (gw, lender, started):
        (await gw.acquire(gw.resolve("tiny"), keep_alive=None, num_ctx=None)).release()
        [plan] = started
        assert plan.split is not None and set(lender.workers) == {"w0"}
        # the one layer on the worker (RPC0), the output layer on this node's GPUs, placed over both
        assert plan.split.local_slots == 1 and plan.split.n_gpu_layers == 2
        assert plan.split.tensor_split == (1,)
        assert plan.placement is not None and plan.placement.devices == (0, 1)
        argv = build_argv("llama-server", child_spec(launch_spec(plan), plan), host="127.0.0.1", port=9)
        assert _flag(argv, "-ngl") == "2" and _flag(argv, "-ts") == "1,1,0" and "-ot" not in argv
