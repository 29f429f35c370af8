"""Load options in the scheduler: a request with other load options reloads the model (Ollama's
needsReload), one without any is served by the loaded child, a busy child drains first; ``num_gpu`` 0
plans no device memory on a GPU node (issue 14 item 6)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest
from tests.fakes.runner import StubRunner

from llmman.runner.argv import LoadOptions
from llmman.sched.gpu import Device, NodeMemory
from llmman.sched.plan import ModelPlan, Runner, reloads
from llmman.sched.scheduler import Scheduler

pytestmark = pytest.mark.timeout(30)
G = 10**9


class Launcher:
    """A ready StubRunner per load; keeps the plans it was given."""

    def __init__(self) -> None:
        self.plans: list[ModelPlan] = []

    async def __call__(self, plan: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        self.plans.append(plan)
        return StubRunner(f"http://127.0.0.1:{9000 + len(self.plans)}", 100 + len(self.plans), on_exit)


BASE = ModelPlan("docker.io/ai/a:1", "sha256:" + "0" * 64, G, 2048, model_path="/m/a.gguf", estimate=G)


def asking(**load: object) -> ModelPlan:
    gpu = load.pop("gpu_layers", None)
    assert gpu is None or isinstance(gpu, int)
    return replace(BASE, load=LoadOptions(**load),  # type: ignore[arg-type]
                   asked_gpu_layers=gpu, n_gpu_layers=gpu)


@pytest.mark.parametrize(("loaded", "wanted", "expected"), [
    (BASE, BASE, False),
    (asking(threads=2), BASE, False),  # nothing asked: the loaded child serves it
    (asking(threads=2), asking(threads=2), False),
    (asking(threads=2), asking(threads=3), True),
    (BASE, asking(batch=64), True),
    (BASE, asking(mmap=False), True),
    (asking(mlock=True), asking(mlock=True, main_gpu=0), True),
    (asking(gpu_layers=0), asking(gpu_layers=0), False),
    (BASE, asking(gpu_layers=0), True),
    (replace(BASE, n_gpu_layers=12), asking(gpu_layers=12), False),  # the preset's -ngl, asked again
])  # fmt: skip
def test_reloads(loaded: ModelPlan, wanted: ModelPlan, expected: bool) -> None:
    assert reloads(loaded, wanted) is expected


async def test_other_load_options_reload_an_idle_model() -> None:
    launcher = Launcher()
    sched = Scheduler(launcher, default_keep_alive=300)
    first = await sched.acquire(asking(threads=2))
    first.release()
    same = await sched.acquire(BASE)
    assert same.runner is first.runner
    same.release()
    other = await sched.acquire(asking(threads=4))
    assert other.runner is not first.runner
    assert [p.load.threads for p in launcher.plans] == [2, 4]
    assert isinstance(first.runner, StubRunner) and first.runner.stopped.is_set()
    other.release()
    await sched.close()


async def test_a_busy_model_drains_before_reloading_with_other_options() -> None:
    launcher = Launcher()
    sched = Scheduler(launcher, default_keep_alive=300)
    busy = await sched.acquire(BASE)
    waiting = asyncio.create_task(sched.acquire(asking(batch=128)))
    deadline = asyncio.get_running_loop().time() + 5
    while not sched._table[BASE.key].leaving:
        assert asyncio.get_running_loop().time() < deadline, "the busy child was never told to drain"
        await asyncio.sleep(0.005)
    assert not waiting.done() and sched.queued() == 1  # it waits for the busy request to finish
    busy.release()
    lease = await asyncio.wait_for(waiting, 5)
    assert lease.runner is not busy.runner and launcher.plans[-1].load.batch == 128
    lease.release()
    await sched.close()


async def test_num_gpu_0_plans_no_device_memory_on_a_gpu_node() -> None:
    """A model larger than the GPUs loads with num_gpu 0 (its layers on the host); no device counts it."""
    node = NodeMemory("cuda", (Device("cuda", 0, "GPU0", 10 * G, 10 * G),))
    launcher = Launcher()
    sched = Scheduler(launcher, default_keep_alive=300, capacity=node.capacity, node_memory=node)
    big = replace(asking(gpu_layers=0), estimate=30 * G)
    lease = await sched.acquire(big)
    assert launcher.plans[-1].placement is None
    small = ModelPlan("docker.io/ai/b:1", "sha256:" + "1" * 64, G, 2048, model_path="/m/b.gguf",
                      estimate=9 * G)
    other = await sched.acquire(small)  # the GPU is all its own: nothing was evicted for it
    assert {s.reference for s in sched.snapshot()} == {big.reference, small.reference}
    lease.release()
    other.release()
    await sched.close()
