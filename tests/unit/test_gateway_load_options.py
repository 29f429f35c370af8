"""The gateway's plan for a request's load options (llmman.gateway.Gateway.plan): each lands in the plan
and its flags, ``num_batch`` in the estimate, ``num_gpu`` over a preset's ``gpu_layers``, and ``main_gpu``
pins the model to that GPU on a GPU node (issue 14 item 6)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from tests.fakes.inprocess import make_store

from llmman.config.presets import Preset
from llmman.errors import BadRequest
from llmman.gateway import Gateway
from llmman.protocol.ollama.fields import RunnerOptions
from llmman.sched.gpu import Device, NodeMemory
from llmman.sched.scheduler import Scheduler

G = 10**9


async def _never(*_: object) -> object:
    raise AssertionError("nothing is loaded here")


def two_gpus() -> NodeMemory:
    return NodeMemory("cuda", (Device("cuda", 0, "GPU0", 10 * G, 10 * G),
                               Device("cuda", 1, "GPU1", 10 * G, 10 * G)))


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def gateway(tmp: Path, session: aiohttp.ClientSession, node: NodeMemory | None = None,
            preset: Preset | None = None) -> Gateway:
    store = make_store(tmp, ("tiny",))
    sched = Scheduler(_never, default_keep_alive=300, node_memory=node, capacity=node.capacity if node else 0)
    presets = {"tiny": preset} if preset else None
    return Gateway(store, sched, session, context_length=2048, aliases={}, presets=presets)


async def test_load_options_are_in_the_plan_and_its_flags(tmp_path: Path,
                                                          session: aiohttp.ClientSession) -> None:
    gw = gateway(tmp_path, session)
    model = gw.resolve("tiny")
    plain = gw.plan(model)
    asked = gw.plan(model, options=RunnerOptions(num_ctx=1024, num_thread=3, num_batch=2048, num_gpu=0,
                                                 main_gpu=0, use_mmap=False))
    assert asked.n_ctx == 1024 and asked.n_gpu_layers == 0 and asked.on_host
    assert asked.extra_args == ("-t", "3", "-b", "2048", "-ub", "2048", "-mg", "0", "-lm", "none",
                                "-dev", "none")  # num_gpu 0: no device at all
    assert asked.child != plain.child  # another child
    # num_batch is the physical batch the estimate counts (capped at the context it can fill)
    assert gw.plan(model, options=RunnerOptions(num_batch=1024)).estimate > plain.estimate
    assert gw.plan(model, options=RunnerOptions(num_batch=64)).estimate < plain.estimate


async def test_num_gpu_overrides_the_presets_gpu_layers(tmp_path: Path,
                                                        session: aiohttp.ClientSession) -> None:
    gw = gateway(tmp_path, session, preset=Preset("tiny", gpu_layers=20, extra_args=("-t", "8")))
    model = gw.resolve("tiny")
    assert gw.plan(model).n_gpu_layers == 20
    asked = gw.plan(model, options=RunnerOptions(num_gpu=5, num_thread=2))
    assert asked.n_gpu_layers == 5
    assert asked.extra_args == ("-t", "8", "-t", "2")  # after the preset's: the request's wins


async def test_main_gpu_pins_the_model_to_that_gpu_on_a_gpu_node(tmp_path: Path,
                                                                 session: aiohttp.ClientSession) -> None:
    gw = gateway(tmp_path, session, two_gpus())
    model = gw.resolve("tiny")
    plan = gw.plan(model, options=RunnerOptions(main_gpu=1))
    assert plan.devices == "1" and "-mg" not in plan.extra_args and plan.load.main_gpu == 1
    with pytest.raises(BadRequest, match=r'option "main_gpu" is 2, but tiny may use 2 GPUs'):
        gw.plan(model, options=RunnerOptions(main_gpu=2))


async def test_main_gpu_counts_among_a_presets_devices(tmp_path: Path,
                                                       session: aiohttp.ClientSession) -> None:
    gw = gateway(tmp_path, session, two_gpus(), Preset("tiny", devices="1,0"))
    model = gw.resolve("tiny")
    assert gw.plan(model, options=RunnerOptions(main_gpu=0)).devices == "1"
    with pytest.raises(BadRequest, match=r"its preset's devices \(1,0\)"):
        gw.plan(model, options=RunnerOptions(main_gpu=2))
