"""A load whose every waiter went away (client disconnected, request cancelled) must still get its
keep_alive: it finishes loading with nobody holding it, and then expires like any idle model."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest
from tests.fakes.runner import StubRunner

from llmman.sched.scheduler import ModelPlan, Runner, Scheduler

pytestmark = pytest.mark.timeout(30)


class GatedRunner(StubRunner):
    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", 4242)


class GatedLauncher:
    """Loads block until ``gate`` is set."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.runners: list[GatedRunner] = []

    async def __call__(self, plan: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        self.entered.set()
        await self.gate.wait()
        runner = GatedRunner()
        self.runners.append(runner)
        return runner


PLAN = ModelPlan(reference="docker.io/ai/a:1", digest="sha256:" + "0" * 64, size=1, n_ctx=2048)


async def _abandon_load(sched: Scheduler, launcher: GatedLauncher, keep_alive: float | None) -> None:
    waiter = asyncio.create_task(sched.acquire(PLAN, keep_alive=keep_alive))
    await launcher.entered.wait()
    load = sched._table[PLAN.reference].load_task  # the shielded load, which outlives its waiter
    assert load is not None
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    launcher.gate.set()
    await load


async def test_abandoned_load_with_keep_alive_zero_unloads_when_ready() -> None:
    launcher = GatedLauncher()
    sched = Scheduler(launcher, default_keep_alive=300)
    await _abandon_load(sched, launcher, keep_alive=0)
    await asyncio.wait_for(launcher.runners[0].stopped.wait(), 5)
    assert sched.snapshot() == []
    await sched.close()


async def test_abandoned_load_starts_its_keep_alive_timer() -> None:
    ticks = itertools.count(1000)
    launcher = GatedLauncher()
    sched = Scheduler(launcher, default_keep_alive=300, clock=lambda: float(next(ticks)))
    await _abandon_load(sched, launcher, keep_alive=None)
    assert sched.is_loaded(PLAN.reference)
    first, second = sched.snapshot(), sched.snapshot()
    # A running timer fixes expires_at; without one it would be "now + keep_alive" and move with the clock.
    assert first[0].expires_at is not None
    assert first[0].expires_at == second[0].expires_at
    assert first[0].refcount == 0
    await sched.close()
    assert launcher.runners[0].stopped.is_set()
