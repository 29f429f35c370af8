"""A split child's flags (llmman.runner.argv: ``--rpc``, ``-ot``) and plan (llmman.sched.plan: its own
child)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from llmman.cluster.placement import LOCAL, NodeView
from llmman.cluster.split import Costs, plan_split
from llmman.runner.argv import KEEP_LOCAL, LaunchSpec, build_argv
from llmman.sched.plan import ModelPlan, Split

MB = 1_000_000


def test_split_child_argv_golden() -> None:
    spec = LaunchSpec(model_path=Path("/m/gemma.gguf"), alias="gemma3:270m", n_ctx=1024, n_gpu_layers=14,
                      tensor_split=(6, 8), rpc=("10.0.0.2:50101", "10.0.0.3:50102"))
    assert build_argv("llama-server", spec, host="127.0.0.1", port=9)[-10:] == [
        "--log-verbosity", "4", "-ngl", "14", "-ts", "6,8",
        "--rpc", "10.0.0.2:50101,10.0.0.3:50102", "-ot", KEEP_LOCAL,
    ]  # fmt: skip
    assert KEEP_LOCAL == r"^(token_embd|output)\.weight$=CPU"


def test_no_rpc_no_split_flags() -> None:
    argv = build_argv("llama-server", LaunchSpec(model_path=Path("/m/x.gguf"), alias="x", n_ctx=256),
                      host="127.0.0.1", port=9)
    assert "--rpc" not in argv and "-ot" not in argv


def test_plan_flags_count_the_output_slot() -> None:
    costs = Costs(head=100 * MB, layers=(10 * MB,) * 10, compute=20 * MB)
    peers = [NodeView("b:1", 70 * MB, url="http://b:1", lends=True),
             NodeView("c:1", 120 * MB, url="http://c:1", lends=True)]
    plan = plan_split("m:1", costs, NodeView(LOCAL, 150 * MB), peers)
    assert [s.layers for s in plan.shares] == [3, 5, 2]
    # llama.cpp offloads the last ngl of n_layer + 1 (the output layer last): 7 layers + the output slot
    assert plan.n_gpu_layers == 8
    assert plan.tensor_split == (5, 3)
    alone = plan_split("m:1", costs, NodeView(LOCAL, 1000 * MB), [])
    assert alone.workers == () and alone.n_gpu_layers == 0 and alone.tensor_split == ()


def test_a_split_plan_is_its_own_child() -> None:
    whole = ModelPlan(reference="docker.io/ai/gemma3:270m", digest="sha256:x", size=1, n_ctx=1024,
                      model_path="/blobs/sha256-abc")
    split = replace(whole, estimate=200, split=Split(("a:1",), 2, (2,), (("local", 200), ("b", 100))))
    again = replace(split, split=Split(("a:2",), 2, (2,), (("local", 200), ("b", 100))))
    assert whole.child != split.child != again.child
    assert split.key == whole.key  # the same table key: unloading the model's name unloads the split
    assert split.child == replace(split, split=Split(("a:1",), 2, (2,), ())).child
