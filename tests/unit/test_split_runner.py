"""The split child's wrapper (llmman.cluster.split_runner.SplitRunner): its leases are released whenever the
child stops, however it stops, and a lost worker ends the child."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tests.fakes.runner import StubRunner

from llmman.cluster.split_runner import SplitRunner
from llmman.runner.crash import Cause
from llmman.sched.plan import Runner, WorkerLeases


class Recorded:
    """WorkerLeases that record what the wrapper does with them."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.lost: Callable[[str], None] | None = None

    @property
    def spent(self) -> bool:
        return self.released.is_set()

    def watch(self, lost: Callable[[str], None]) -> None:
        self.lost = lost

    async def release(self) -> None:
        self.released.set()


class Exits(list[Runner]):
    """The scheduler's ``on_exit``: the runners reported dead, and an event once one is."""

    def __init__(self) -> None:
        super().__init__()
        self.told = asyncio.Event()

    def __call__(self, runner: Runner) -> None:
        self.append(runner)
        self.told.set()


def wrapped() -> tuple[SplitRunner, StubRunner, Recorded, Exits]:
    leases, exits = Recorded(), Exits()
    checked: WorkerLeases = leases  # the Protocol the launcher hands over
    wrapper = SplitRunner(checked, exits)
    child = StubRunner("http://127.0.0.1:9", None, on_exit=wrapper.child_exited)
    wrapper.attach(child)
    return wrapper, child, leases, exits


async def test_stop_stops_the_child_then_releases() -> None:
    wrapper, child, leases, exits = wrapped()
    assert leases.lost is not None  # watched from attach on
    assert wrapper.base_url == "http://127.0.0.1:9" and wrapper.pid is None
    await wrapper.stop(1.0)
    assert child.stopped.is_set() and leases.released.is_set() and exits == []


async def test_a_crash_releases_and_tells_the_scheduler() -> None:
    wrapper, child, leases, exits = wrapped()
    child.crash(Cause.KILLED)
    assert exits == [wrapper] and wrapper.exit_cause is Cause.KILLED
    await asyncio.wait_for(leases.released.wait(), 5)


async def test_a_lost_worker_ends_the_child() -> None:
    wrapper, child, leases, exits = wrapped()
    assert leases.lost is not None
    leases.lost("the RPC worker on b:1 (10.0.0.3:5000) is gone")
    await asyncio.wait_for(child.stopped.wait(), 5)  # no process to kill: stopped instead
    await asyncio.wait_for(leases.released.wait(), 5)
    assert wrapper.exit_detail == "split ended: the RPC worker on b:1 (10.0.0.3:5000) is gone"
    await asyncio.wait_for(exits.told.wait(), 5)  # the scheduler is told the child died
    assert exits == [wrapper]
