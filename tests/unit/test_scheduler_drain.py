"""Draining, with an in-memory launcher (no processes): a stop of a busy model lets its requests finish
while new ones wait for a fresh child (so ``llmman stop`` takes effect under steady traffic), and a
draining node unloads every model once idle, whatever its keep_alive, while still serving what reaches it."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest
from tests.fakes.runner import StubRunner

from llmman.errors import ServerBusy
from llmman.sched.scheduler import Lease, ModelPlan, Runner, Scheduler

pytestmark = pytest.mark.timeout(30)

A, B = "docker.io/ai/a:1", "docker.io/ai/b:1"


class Launcher:
    """Starts StubRunners (the n-th on port 9000 + n); loads wait for ``gate``."""

    def __init__(self) -> None:
        self.started: list[StubRunner] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def __call__(self, plan: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        self.entered.set()
        await self.gate.wait()
        runner = StubRunner(f"http://127.0.0.1:{9000 + len(self.started)}", 1000 + len(self.started), on_exit)
        self.started.append(runner)
        return runner


def plan(name: str = A) -> ModelPlan:
    return ModelPlan(reference=name, digest="sha256:" + "0" * 64, size=100, n_ctx=2048)


async def until(condition: Callable[[], bool], what: str, within: float = 5.0) -> None:
    """Poll ``condition`` on the event loop until it holds; fail naming ``what`` after ``within`` s."""
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def refs(sched: Scheduler) -> list[str]:
    return sorted(s.reference for s in sched.snapshot())


# ---------------------------------------------------------------------------------- stopping a model
async def test_a_stopped_busy_model_takes_no_new_request_and_reloads_after() -> None:
    launcher = Launcher()
    sched = Scheduler(launcher, default_keep_alive=300)
    first = await sched.acquire(plan())
    assert await sched.unload(A) is True
    (snap,) = sched.snapshot()
    assert snap.draining and snap.ready
    late = asyncio.create_task(sched.acquire(plan()))
    await until(lambda: sched.queued() == 1, "the new request to wait for the stopped model")
    assert not late.done() and sched.snapshot()[0].refcount == 2  # in flight + held back
    first.release()  # the last request on the old child: it stops, then the waiter loads it afresh
    lease = await asyncio.wait_for(late, 5)
    assert launcher.started[0].stopped.is_set()
    assert lease.base_url == launcher.started[1].base_url
    (snap,) = sched.snapshot()
    assert not snap.draining and snap.expires_at is not None  # the fresh child keeps its keep_alive
    lease.release()
    assert not launcher.started[1].stopped.is_set()
    await sched.close()


async def test_stop_under_steady_overlapping_traffic_takes_effect() -> None:
    """Requests overlap so the model is never idle: the stop still replaces the child, and every request
    gets a lease (none is refused or lost)."""
    launcher = Launcher()
    sched = Scheduler(launcher, default_keep_alive=300)
    held: list[Lease] = [await sched.acquire(plan())]
    stopped = False
    served: list[str] = []
    for i in range(6):
        nxt = asyncio.create_task(sched.acquire(plan()))  # overlaps the one in flight
        if i == 2:
            assert await sched.unload(A)
            stopped = True
        if stopped and len(launcher.started) == 1:
            await until(lambda: sched.queued() == 1, "the request to wait for the stopped model")
        old = held.pop()
        served.append(old.base_url)
        old.release()
        held.append(await asyncio.wait_for(nxt, 5))
    served.append(held.pop().base_url)
    assert len(launcher.started) == 2 and launcher.started[0].stopped.is_set()
    assert served[:3] == [launcher.started[0].base_url] * 3
    assert set(served[3:]) == {launcher.started[1].base_url}
    await sched.close()


async def test_stop_during_a_load_serves_its_waiters_then_reloads_for_later_ones() -> None:
    launcher = Launcher()
    launcher.gate.clear()
    sched = Scheduler(launcher, default_keep_alive=300)
    waiting = asyncio.create_task(sched.acquire(plan()))
    await launcher.entered.wait()
    unloading = asyncio.create_task(sched.unload(A))
    await until(lambda: sched.snapshot()[0].draining, "the loading model to be marked draining")
    late = asyncio.create_task(sched.acquire(plan()))
    await until(lambda: sched.queued() == 2, "the late request to be held back")  # load + held back
    launcher.gate.set()
    first = await waiting
    assert await unloading is True
    assert first.base_url == launcher.started[0].base_url and not late.done()
    first.release()
    second = await asyncio.wait_for(late, 5)
    assert second.base_url == launcher.started[1].base_url and launcher.started[0].stopped.is_set()
    second.release()
    await sched.close()


async def test_requests_held_back_count_against_max_queue() -> None:
    launcher = Launcher()
    sched = Scheduler(launcher, default_keep_alive=300, max_queue=1)
    first = await sched.acquire(plan())
    await sched.unload(A)
    held = asyncio.create_task(sched.acquire(plan()))
    await until(lambda: sched.queued() == 1, "the request to be held back")
    with pytest.raises(ServerBusy):
        await sched.acquire(plan())
    held.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held
    assert sched.queued() == 0 and sched.snapshot()[0].refcount == 1
    first.release()
    await until(lambda: sched.snapshot() == [], "the stopped model to go")
    await sched.close()


async def test_a_child_stopping_stays_in_the_table_until_it_has_exited() -> None:
    """Its memory is still in use: it shows (draining) and a new load of the model waits for the exit."""
    release_stop = asyncio.Event()

    class SlowStop(StubRunner):
        async def stop(self, grace: float = 10.0) -> None:
            await release_stop.wait()
            await super().stop(grace)

    started: list[StubRunner] = []

    async def launch(p: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        started.append(SlowStop(f"http://127.0.0.1:{9100 + len(started)}", None, on_exit))
        return started[-1]

    sched = Scheduler(launch, default_keep_alive=0)
    (await sched.acquire(plan())).release()  # keep_alive 0: stopping now
    await until(lambda: sched.snapshot()[0].draining, "the child to be stopping")
    again = asyncio.create_task(sched.acquire(plan()))
    await until(lambda: sched.queued() == 1, "the new request to wait for the exit")
    assert len(started) == 1
    release_stop.set()
    lease = await asyncio.wait_for(again, 5)
    assert len(started) == 2 and lease.base_url == started[1].base_url
    lease.release()
    await sched.close()


# ---------------------------------------------------------------------------------- draining the node
async def test_drain_unloads_idle_models_at_once_and_busy_ones_when_done() -> None:
    launcher = Launcher()
    sched = Scheduler(launcher, default_keep_alive=300)
    (await sched.acquire(plan(A), keep_alive=math.inf)).release()  # pinned, idle
    busy = await sched.acquire(plan(B))
    sched.drain()
    assert sched.draining
    await until(lambda: refs(sched) == [B], "the idle pinned model to unload")
    assert not launcher.started[1].stopped.is_set()
    busy.release()
    await until(lambda: sched.snapshot() == [], "the busy model to unload once done")
    sched.drain()  # idempotent
    await sched.close()


async def test_a_draining_node_still_serves_and_unloads_once_idle() -> None:
    launcher = Launcher()
    sched = Scheduler(launcher, default_keep_alive=300)
    sched.drain()
    lease = await sched.acquire(plan(), keep_alive=math.inf)
    assert lease.base_url == launcher.started[0].base_url
    lease.release()
    await until(lambda: launcher.started[0].stopped.is_set(), "the model to unload once idle")
    sched.undrain()
    assert not sched.draining
    (await sched.acquire(plan())).release()
    (snap,) = sched.snapshot()
    assert snap.expires_at is not None and not launcher.started[1].stopped.is_set()  # keep_alive again
    await sched.close()


async def test_a_draining_node_restarts_no_crashed_model() -> None:
    launcher = Launcher()
    sched = Scheduler(launcher, default_keep_alive=300, heal_base=0.01)
    lease = await sched.acquire(plan())
    sched.drain()
    launcher.started[0].crash()  # busy and crashed: a restart is due after the backoff...
    assert sched.healer._tasks
    lease.release()
    await until(lambda: not sched.healer._tasks, "the restart's turn to come")
    assert len(launcher.started) == 1 and sched.snapshot() == []  # ...but not while draining
    await sched.close()


async def test_a_pinned_load_nobody_waits_for_unloads_when_ready_on_a_draining_node() -> None:
    launcher = Launcher()
    launcher.gate.clear()
    sched = Scheduler(launcher, default_keep_alive=300)
    waiter = asyncio.create_task(sched.acquire(plan(), keep_alive=math.inf))
    await launcher.entered.wait()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    sched.drain()
    launcher.gate.set()
    await until(lambda: len(launcher.started) == 1 and launcher.started[0].stopped.is_set(),
                "the pinned load to unload once ready")
    assert sched.snapshot() == []
    await sched.close()
