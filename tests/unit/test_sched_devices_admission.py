"""Per-device admission through the real scheduler, whose children are stand-ins without a process
(tests/fakes/runner.py), on a node of two fake GPUs: a pinned model evicts (or waits for) only what shares
its device, a model too big for one device is split, a pin too small fails at once, and a host-only node
keeps the node-wide rule."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from tests.fakes.runner import StubRunner

from llmman.errors import LlmmanError
from llmman.sched.devices import Placement, device_document
from llmman.sched.gpu import Device, NodeMemory
from llmman.sched.plan import ModelPlan, Runner
from llmman.sched.scheduler import Scheduler

G = 10**9


class Launcher:
    """Starts a stand-in child per plan and keeps the plans it was given (with their placement)."""

    def __init__(self) -> None:
        self.plans: list[ModelPlan] = []
        self.runners: dict[str, StubRunner] = {}

    async def __call__(self, plan: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        self.plans.append(plan)
        runner = StubRunner(f"http://127.0.0.1:{9000 + len(self.plans)}", 1000 + len(self.plans), on_exit)
        self.runners[plan.reference] = runner
        return runner

    def placement(self, reference: str) -> Placement | None:
        return next(p.placement for p in reversed(self.plans) if p.reference == reference)


def two_gpus(accelerator: str = "cuda") -> NodeMemory:
    return NodeMemory(accelerator, (Device(accelerator, 0, "GPU0", 10 * G, 10 * G),
                                    Device(accelerator, 1, "GPU1", 10 * G, 10 * G)))


def plan(name: str, gb: int, pin: str | None = None) -> ModelPlan:
    return ModelPlan(f"docker.io/ai/{name}:1", "sha256:" + "0" * 64, gb * G, 512,
                     model_path=f"/m/{name}.gguf", estimate=gb * G, devices=pin)


def scheduler(launcher: Launcher, node: NodeMemory) -> Scheduler:
    return Scheduler(launcher, default_keep_alive=300, capacity=node.capacity, node_memory=node)


def loaded(sched: Scheduler) -> list[str]:
    return sorted(s.reference.split("/")[-1] for s in sched.snapshot())


async def test_a_pinned_model_evicts_only_what_shares_its_device() -> None:
    launcher = Launcher()
    sched = scheduler(launcher, two_gpus())
    for name in ("a", "b"):
        (await sched.acquire(plan(name, 6))).release()
    assert launcher.placement("docker.io/ai/a:1") == Placement((0,), (1.0,))
    assert launcher.placement("docker.io/ai/b:1") == Placement((1,), (1.0,))  # the device with most room
    # 8 GB pinned to GPU 1: the node has 8 GB free in all, but GPU 1 only 4. Only b sits there.
    (await sched.acquire(plan("c", 8, pin="1"))).release()
    assert loaded(sched) == ["a:1", "c:1"]
    assert launcher.runners["docker.io/ai/b:1"].stopped.is_set()
    assert not launcher.runners["docker.io/ai/a:1"].stopped.is_set()
    assert launcher.placement("docker.io/ai/c:1") == Placement((1,), (1.0,))
    figures = {d["index"]: d for d in device_document(sched.node_memory, sched.snapshot())}
    assert figures[0]["models"] == ["docker.io/ai/a:1"] and figures[0]["planned"] == 6 * G
    assert figures[1]["models"] == ["docker.io/ai/c:1"] and figures[1]["free"] == 2 * G
    await sched.close()


async def test_a_model_too_big_for_one_device_is_split_by_room() -> None:
    launcher = Launcher()
    sched = scheduler(launcher, two_gpus())
    (await sched.acquire(plan("a", 6))).release()
    (await sched.acquire(plan("big", 12))).release()  # 4 + 10 GB free: neither alone, both together
    assert loaded(sched) == ["a:1", "big:1"]
    placement = launcher.placement("docker.io/ai/big:1")
    assert placement is not None and placement.devices == (1, 0)
    assert placement.split == pytest.approx((10 / 14, 4 / 14))
    await sched.close()


async def test_an_unpinned_model_evicts_when_no_device_and_no_split_fits() -> None:
    launcher = Launcher()
    sched = scheduler(launcher, two_gpus())
    for name in ("a", "b"):
        (await sched.acquire(plan(name, 6))).release()
    (await sched.acquire(plan("c", 12))).release()  # 8 GB free in all: one of a, b must go
    assert len(loaded(sched)) == 2 and "c:1" in loaded(sched)
    await sched.close()


async def test_a_pin_too_small_for_the_model_fails_at_once() -> None:
    launcher = Launcher()
    sched = scheduler(launcher, two_gpus())
    with pytest.raises(LlmmanError) as caught:
        await sched.acquire(plan("c", 12, pin="0"))  # the node has 20 GB, GPU 0 10
    assert caught.value.status == 500 and caught.value.code == "insufficient_memory"
    assert "12.0 GB" in caught.value.message and "10.0 GB" in caught.value.message
    assert "(0, from its preset)" in caught.value.message
    assert launcher.plans == []
    await sched.close()


async def test_a_host_only_node_keeps_the_node_wide_rule() -> None:
    launcher = Launcher()
    sched = scheduler(launcher, two_gpus("cpu"))  # two RAM "devices" are still one pool
    for name in ("a", "b"):
        (await sched.acquire(plan(name, 6))).release()
    (await sched.acquire(plan("c", 8, pin="1"))).release()  # 8 GB free of 20: fits, no pin is read
    assert loaded(sched) == ["a:1", "b:1", "c:1"]
    (await sched.acquire(plan("d", 6))).release()  # 0 free: one goes, as before
    assert len(loaded(sched)) == 3 and "d:1" in loaded(sched)
    assert all(p.placement is None for p in launcher.plans)
    await sched.close()


async def test_a_pinned_model_waits_only_for_the_busy_model_on_its_device() -> None:
    launcher = Launcher()
    sched = scheduler(launcher, two_gpus())
    lease_a = await sched.acquire(plan("a", 6))  # GPU 0, busy
    lease_b = await sched.acquire(plan("b", 6))  # GPU 1, busy
    waiting = asyncio.create_task(sched.acquire(plan("c", 8, pin="1")))
    deadline = asyncio.get_running_loop().time() + 10
    while not any(s.draining for s in sched.snapshot()):
        assert asyncio.get_running_loop().time() < deadline, "nothing was marked to make room"
        await asyncio.sleep(0.01)
    draining = {s.reference.split("/")[-1]: s.draining for s in sched.snapshot()}
    assert draining == {"a:1": False, "b:1": True, "c:1": False}  # b drains; a, on GPU 0, is left alone
    lease_b.release()
    (await asyncio.wait_for(waiting, 10)).release()
    assert loaded(sched) == ["a:1", "c:1"]
    lease_a.release()
    await sched.close()
