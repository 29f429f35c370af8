"""A request queued for admission whose client goes away loads nothing and evicts nothing: the busy
model it had asked to drain (max_loaded_models, memory) stays loaded with its child, and the queue
forgets the request at once (issue 14 item 4; the daemon-level test is
tests/integration/test_queue_abandon.py)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest
from tests.fakes.runner import StubRunner

from llmman.sched.scheduler import ModelPlan, Runner, Scheduler

pytestmark = pytest.mark.timeout(30)


class Launcher:
    """Starts a ready StubRunner per load; counts the loads by reference."""

    def __init__(self) -> None:
        self.started: list[tuple[str, StubRunner]] = []

    async def __call__(self, plan: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        runner = StubRunner(f"http://127.0.0.1:{9000 + len(self.started)}", 500 + len(self.started), on_exit)
        self.started.append((plan.reference, runner))
        return runner


def plan(name: str, estimate: int = 0) -> ModelPlan:
    return ModelPlan(reference=name, digest="sha256:" + "0" * 64, size=100, n_ctx=2048, estimate=estimate)


A, B = "docker.io/ai/a:1", "docker.io/ai/b:1"


async def until(condition: Callable[[], bool], what: str, within: float = 5.0) -> None:
    """Poll ``condition`` on the event loop until it holds; fail naming ``what`` after ``within`` s."""
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("keep_alive", [None, math.inf], ids=["default", "forever"])
@pytest.mark.parametrize("limit", ["count", "memory"])
async def test_a_queued_request_that_leaves_evicts_nobody(limit: str, keep_alive: float | None) -> None:
    """Whatever its keep_alive: a load kept forever still waiting for room is not started either."""
    launcher = Launcher()
    if limit == "count":
        sched = Scheduler(launcher, default_keep_alive=300, max_loaded=1)
        a_plan, b_plan = plan(A), plan(B)
    else:  # room for one of the two
        sched = Scheduler(launcher, default_keep_alive=300, capacity=1000)
        a_plan, b_plan = plan(A, 600), plan(B, 600)
    lease = await sched.acquire(a_plan)  # A busy: its only request is in flight
    waiting = asyncio.create_task(sched.acquire(b_plan, keep_alive=keep_alive))
    await until(lambda: sched._table[A].evicting, "A to be asked to drain for B")
    assert sched.queued() == 1

    waiting.cancel()  # B's client went away
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await until(lambda: B not in sched._table, "B to leave the queue")
    assert sched.queued() == 0
    a = sched._table[A]
    assert not a.evicting and not a.leaving
    assert not [snap for snap in sched.snapshot() if snap.draining]

    lease.release()  # A frees up: it keeps its keep_alive instead of going for nobody
    assert sched._table[A] is a and a.stopping is None and a.expires_at is not None
    again = await sched.acquire(a_plan)
    assert again.runner is lease.runner  # the same child
    assert [ref for ref, _ in launcher.started] == [A]  # B never loaded
    again.release()
    await sched.close()


async def test_another_waiter_still_gets_the_room() -> None:
    """Only the request that left is forgotten: a second one queued for B still makes A drain and loads."""
    launcher = Launcher()
    sched = Scheduler(launcher, default_keep_alive=300, max_loaded=1)
    lease = await sched.acquire(plan(A))
    leaving = asyncio.create_task(sched.acquire(plan(B)))
    staying = asyncio.create_task(sched.acquire(plan(B)))
    await until(lambda: sched._table[A].evicting, "A to be asked to drain for B")
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert sched._table[A].evicting and sched.queued() == 1
    lease.release()
    b_lease = await asyncio.wait_for(staying, 5)
    assert b_lease.reference == B and A not in sched._table
    b_lease.release()
    await sched.close()
