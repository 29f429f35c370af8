"""A load whose every waiter went away (client disconnected, a front node gave up on this peer) is
cancelled and its child killed, so no stray copy stays loaded for its keep_alive; a pinned load (a
preload, keep_alive forever) and a restart nobody asked for load for themselves."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest
from tests.fakes.runner import StubRunner

from llmman.sched.scheduler import ModelPlan, Runner, Scheduler

pytestmark = pytest.mark.timeout(30)


class GatedRunner(StubRunner):
    def __init__(self, n: int, on_exit: Callable[[Runner], None]) -> None:
        super().__init__(f"http://127.0.0.1:{9000 + n}", 4242 + n, on_exit)


class GatedLauncher:
    """Loads block until ``gate`` is set; a load cancelled meanwhile is counted in ``cancelled``
    (the real launcher kills its child then: llmman.runner.process.LlamaServerProcess.start)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.loads = 0
        self.cancelled = 0
        self.runners: list[GatedRunner] = []

    async def __call__(self, plan: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        self.loads += 1
        self.entered.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        runner = GatedRunner(len(self.runners), on_exit)
        self.runners.append(runner)
        return runner


async def until(condition: Callable[[], bool], what: str, within: float = 5.0) -> None:
    """Poll ``condition`` on the event loop until it holds; fail naming ``what`` after ``within`` s."""
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


PLAN = ModelPlan(reference="docker.io/ai/a:1", digest="sha256:" + "0" * 64, size=1, n_ctx=2048)


async def _leave_during_load(sched: Scheduler, launcher: GatedLauncher,
                             keep_alive: float | None) -> asyncio.Task[Runner]:
    """Start a request, let it leave while the model loads; the load task (which may outlive it)."""
    waiter = asyncio.create_task(sched.acquire(PLAN, keep_alive=keep_alive))
    await launcher.entered.wait()
    load = sched._table[PLAN.reference].load_task
    assert load is not None
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    return load


@pytest.mark.parametrize("keep_alive", [None, 0, 600])
async def test_abandoned_load_is_cancelled_and_leaves_nothing(keep_alive: float | None) -> None:
    launcher = GatedLauncher()
    sched = Scheduler(launcher, default_keep_alive=300)
    load = await _leave_during_load(sched, launcher, keep_alive)
    await asyncio.wait((load,))
    assert load.cancelled()
    assert launcher.cancelled == 1 and launcher.runners == []
    assert sched.snapshot() == [] and sched.queued() == 0
    assert PLAN.key not in sched.healer.failures  # cancelling is not a failure: no cool-down
    launcher.gate.set()
    (await sched.acquire(PLAN)).release()  # the next request loads it afresh
    assert len(launcher.runners) == 1
    await sched.close()


async def test_request_arriving_as_the_load_is_cancelled_gets_a_fresh_load() -> None:
    launcher = GatedLauncher()
    sched = Scheduler(launcher, default_keep_alive=300)
    waiter = asyncio.create_task(sched.acquire(PLAN))
    await launcher.entered.wait()
    waiter.cancel()
    late = asyncio.create_task(sched.acquire(PLAN))  # runs before the cancelled load has unwound
    with pytest.raises(asyncio.CancelledError):
        await waiter
    launcher.gate.set()
    lease = await asyncio.wait_for(late, 5)
    assert launcher.cancelled == 1 and launcher.loads == 2
    assert lease.base_url == launcher.runners[0].base_url
    assert [s.refcount for s in sched.snapshot()] == [1]
    lease.release()
    await sched.close()


async def test_abandoned_pinned_load_finishes_and_stays_loaded() -> None:
    launcher = GatedLauncher()
    sched = Scheduler(launcher, default_keep_alive=300)
    load = await _leave_during_load(sched, launcher, math.inf)
    launcher.gate.set()
    await load
    assert launcher.cancelled == 0 and sched.is_loaded(PLAN.reference)
    (snap,) = sched.snapshot()
    assert snap.expires_at is None and snap.refcount == 0
    await sched.close()
    assert launcher.runners[0].stopped.is_set()


async def test_a_restart_that_a_request_joined_and_left_still_loads() -> None:
    launcher = GatedLauncher()
    launcher.gate.set()
    sched = Scheduler(launcher, default_keep_alive=300, heal_base=0.01)
    lease = await sched.acquire(PLAN)
    launcher.entered.clear()
    launcher.gate.clear()
    launcher.runners[0].crash()  # busy when it crashed: restarted after the backoff
    lease.release()
    await launcher.entered.wait()  # the restart is loading
    (snap,) = sched.snapshot()
    assert not snap.ready
    joined = asyncio.create_task(sched.acquire(PLAN))
    await until(lambda: sched.snapshot()[0].refcount == 1, "the request to join the restart")
    joined.cancel()
    with pytest.raises(asyncio.CancelledError):
        await joined
    launcher.gate.set()
    await until(lambda: sched.is_loaded(PLAN.reference), "the restart to finish loading")
    assert launcher.cancelled == 0 and len(launcher.runners) == 2
    await sched.close()
