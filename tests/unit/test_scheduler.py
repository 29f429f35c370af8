"""Scheduler rules with an in-memory launcher (no processes): single-flight loads, leases,
keep_alive, unload while busy, a child dying on its own, and shutdown."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest
from tests.fakes.runner import StubRunner

from llmman.errors import LlmmanError, RunnerError
from llmman.sched.scheduler import ModelPlan, Runner, Scheduler


class FakeRunner(StubRunner):
    """Stands for a ready llama-server child (the n-th the launcher started)."""

    def __init__(self, n: int, on_exit: Callable[[Runner], None]) -> None:
        super().__init__(f"http://127.0.0.1:{9000 + n}", 1000 + n, on_exit)


class FakeLauncher:
    def __init__(self) -> None:
        self.started: list[FakeRunner] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()
        self.fail_with: Exception | None = None

    async def __call__(self, plan: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        self.entered.set()
        await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        runner = FakeRunner(len(self.started), on_exit)
        self.started.append(runner)
        return runner


def plan(name: str = "docker.io/ai/a:1", n_ctx: int = 2048) -> ModelPlan:
    return ModelPlan(reference=name, digest="sha256:" + "0" * 64, size=100, n_ctx=n_ctx)


@pytest.fixture
def launcher() -> FakeLauncher:
    return FakeLauncher()


async def test_concurrent_first_requests_start_one_child(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300)
    launcher.gate.clear()
    tasks = [asyncio.create_task(sched.acquire(plan())) for _ in range(5)]
    await launcher.entered.wait()
    launcher.gate.set()
    leases = await asyncio.gather(*tasks)
    assert len(launcher.started) == 1
    assert {lease.base_url for lease in leases} == {launcher.started[0].base_url}
    (snap,) = sched.snapshot()
    assert snap.refcount == 5 and snap.ready
    for lease in leases:
        lease.release()
    assert sched.snapshot()[0].refcount == 0
    await sched.close()


async def test_slow_load_does_not_block_other_models(launcher: FakeLauncher) -> None:
    slow = FakeLauncher()
    slow.gate.clear()

    async def route(p: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        return await (slow if p.reference.endswith("slow:1") else launcher)(p, on_exit)

    sched = Scheduler(route, default_keep_alive=300)
    pending = asyncio.create_task(sched.acquire(plan("docker.io/ai/slow:1")))
    await slow.entered.wait()
    fast = await sched.acquire(plan("docker.io/ai/fast:1"))
    assert fast.base_url == launcher.started[0].base_url
    assert not pending.done()
    slow.gate.set()
    (await pending).release()
    fast.release()
    await sched.close()


async def test_keep_alive_zero_unloads_after_the_request(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300)
    lease = await sched.acquire(plan(), keep_alive=0)
    assert len(sched.snapshot()) == 1
    lease.release()
    await launcher.started[0].stopped.wait()
    assert sched.snapshot() == []


async def test_expiry_timer_unloads_idle_model(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=0.01)
    (await sched.acquire(plan())).release()
    await asyncio.wait_for(launcher.started[0].stopped.wait(), 5)
    assert sched.snapshot() == []


async def test_negative_keep_alive_means_forever(launcher: FakeLauncher) -> None:
    now = [1000.0]
    sched = Scheduler(launcher, default_keep_alive=300, clock=lambda: now[0])
    (await sched.acquire(plan(), keep_alive=math.inf)).release()
    (snap,) = sched.snapshot()
    assert snap.expires_at is None
    (await sched.acquire(plan(), keep_alive=60)).release()
    assert sched.snapshot()[0].expires_at == 1060.0
    await sched.close()


async def test_request_keep_alive_overrides_and_busy_model_shows_now_plus_keep_alive(
    launcher: FakeLauncher,
) -> None:
    now = [1000.0]
    sched = Scheduler(launcher, default_keep_alive=300, clock=lambda: now[0])
    lease = await sched.acquire(plan(), keep_alive=120)
    assert sched.snapshot()[0].expires_at == 1120.0
    now[0] = 1010.0
    lease.release()
    assert sched.snapshot()[0].expires_at == 1130.0
    await sched.close()


async def test_unload_while_busy_waits_for_the_last_lease(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300)
    lease = await sched.acquire(plan())
    assert await sched.unload(plan().reference) is True
    assert not launcher.started[0].stopped.is_set()
    lease.release()
    await launcher.started[0].stopped.wait()
    assert sched.snapshot() == []
    assert await sched.unload(plan().reference) is False


async def test_unload_during_load_waits_then_unloads(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300)
    launcher.gate.clear()
    loading = asyncio.create_task(sched.acquire(plan()))
    await launcher.entered.wait()
    unloading = asyncio.create_task(sched.unload(plan().reference))
    launcher.gate.set()
    lease = await loading
    assert await unloading is True
    lease.release()
    await launcher.started[0].stopped.wait()
    assert sched.snapshot() == []


async def test_crashed_child_is_forgotten_and_next_request_reloads(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300)
    lease = await sched.acquire(plan())
    launcher.started[0].crash()
    assert sched.snapshot() == []
    lease.release()  # releasing a lease on a dead child is harmless
    again = await sched.acquire(plan())
    assert len(launcher.started) == 2 and again.base_url == launcher.started[1].base_url
    again.release()
    await sched.close()


async def test_failed_load_reaches_every_waiter_and_leaves_no_entry(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300, heal_base=0)  # no cool-down here
    launcher.fail_with = RunnerError("llama-server exited with code 1 while loading: boom")
    launcher.gate.clear()
    tasks = [asyncio.create_task(sched.acquire(plan())) for _ in range(3)]
    await launcher.entered.wait()
    launcher.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, RunnerError) and "boom" in str(r) for r in results)
    assert sched.snapshot() == []
    launcher.fail_with = None
    (await sched.acquire(plan())).release()
    assert len(launcher.started) == 1
    await sched.close()


async def test_cancelled_waiter_does_not_cancel_the_load_for_others(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300)
    launcher.gate.clear()
    first = asyncio.create_task(sched.acquire(plan()))
    await launcher.entered.wait()
    second = asyncio.create_task(sched.acquire(plan()))
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    launcher.gate.set()
    lease = await second
    assert sched.snapshot()[0].refcount == 1
    lease.release()
    await sched.close()


async def test_bigger_context_reloads_an_idle_model(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300)
    (await sched.acquire(plan(n_ctx=2048))).release()
    (await sched.acquire(plan(n_ctx=4096))).release()
    assert len(launcher.started) == 2 and launcher.started[0].stopped.is_set()
    assert sched.snapshot()[0].n_ctx == 4096
    (await sched.acquire(plan(n_ctx=1024))).release()
    assert len(launcher.started) == 2
    await sched.close()


async def test_close_stops_every_child_and_refuses_new_work(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300)
    (await sched.acquire(plan("docker.io/ai/a:1"))).release()
    (await sched.acquire(plan("docker.io/ai/b:1"))).release()
    await sched.close()
    assert all(r.stopped.is_set() for r in launcher.started)
    with pytest.raises(LlmmanError) as err:
        await sched.acquire(plan())
    assert err.value.status == 503
