"""Self-healing: the policy (llmman.sched.healing) and the scheduler driving it with an in-memory launcher."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import pytest
from tests.unit.test_scheduler import FakeLauncher, plan

from llmman.errors import RunnerError, ServiceUnavailable
from llmman.sched import healing
from llmman.sched.scheduler import Scheduler


@pytest.fixture
def launcher() -> FakeLauncher:
    return FakeLauncher()


async def until(condition: Callable[[], bool], within: float = 5.0) -> None:
    """Poll ``condition`` (every millisecond) until it holds; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.001)


@pytest.mark.parametrize(("n", "seconds"), [(0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0), (7, 60.0), (99, 60.0)])
def test_backoff_doubles_up_to_the_cap(n: int, seconds: float) -> None:
    assert healing.backoff(n) == seconds


@pytest.mark.parametrize(("n_ctx", "smaller"), [(4096, 2048), (512, 256), (511, None), (256, None)])
def test_smaller_context(n_ctx: int, smaller: int | None) -> None:
    assert healing.smaller_context(n_ctx) == smaller


def test_failures_count_up_and_a_stable_run_starts_over() -> None:
    first = healing.record(None, cause="unknown", message="m", now=100.0, uptime=None)
    assert (first.count, first.until, first.while_serving) == (1, 100.0 + healing.LOAD_BASE_S, False)
    second = healing.record(first, cause="killed by a signal", message="m", now=200.0, uptime=5.0)
    assert (second.count, second.until, second.while_serving) == (2, 202.0, True)
    stable = healing.record(second, cause="unknown", message="m", now=300.0, uptime=healing.STABLE_S)
    assert stable.count == 1


@pytest.mark.parametrize(
    ("count", "pinned", "busy", "restart"),
    [(1, True, False, True), (1, False, True, True), (1, False, False, False),
     (healing.BREAKER_AFTER - 1, True, False, True), (healing.BREAKER_AFTER, True, True, False)],
)  # fmt: skip
def test_should_restart(count: int, pinned: bool, busy: bool, restart: bool) -> None:
    failure = healing.Failure(cause="unknown", message="", count=count, until=0.0)
    assert healing.should_restart(failure, pinned=pinned, busy=busy) is restart
    assert failure.broken is (count >= healing.BREAKER_AFTER)
    assert ("breaker open" in failure.reason()) is failure.broken


async def test_failed_load_cools_down_with_retry_after_and_spawns_nothing(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300, heal_base=6.0)  # 6 / BASE_S x LOAD_BASE_S = 30 s
    error = RunnerError("llama-server exited with code 1 while loading (missing file): gone")
    error.cause = "missing file"
    launcher.fail_with = error
    with pytest.raises(RunnerError):
        await sched.acquire(plan())
    launcher.entered.clear()
    for _ in range(3):
        with pytest.raises(ServiceUnavailable) as caught:
            await sched.acquire(plan())
        assert caught.value.retry_after == 30 and "missing file" in caught.value.message
    assert not launcher.entered.is_set()  # no launch during the cool-down
    await sched.unload(plan().reference)  # an explicit unload forgets the failure
    launcher.fail_with = None
    (await sched.acquire(plan())).release()
    await sched.close()


async def test_pinned_model_is_restarted_after_a_crash(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300, heal_base=0.001)
    (await sched.acquire(plan(), keep_alive=math.inf)).release()
    launcher.started[0].crash()
    await until(lambda: len(launcher.started) == 2 and sched.is_loaded(plan().reference))
    assert sched.healer.failures[plan().key].count == 1
    await sched.close()


async def test_idle_unpinned_model_is_not_restarted(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300, heal_base=0.001)
    (await sched.acquire(plan())).release()
    launcher.started[0].crash()
    await asyncio.sleep(0.05)
    assert len(launcher.started) == 1 and sched.snapshot() == []
    await sched.close()


async def test_breaker_stops_restarting_a_model_that_keeps_crashing(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300, heal_base=0.001)
    (await sched.acquire(plan(), keep_alive=math.inf)).release()
    for n in range(1, healing.BREAKER_AFTER + 1):
        await until(lambda: len(launcher.started) == n and sched.is_loaded(plan().reference))  # noqa: B023
        launcher.started[-1].crash()
    await asyncio.sleep(0.05)
    assert len(launcher.started) == healing.BREAKER_AFTER
    assert sched.healer.failures[plan().key].broken
    await sched.close()


async def test_pinned_model_that_fails_to_load_is_retried_until_the_breaker_opens() -> None:
    attempts: list[int] = []

    async def launch(p, on_exit):  # type: ignore[no-untyped-def]
        attempts.append(p.n_ctx)
        error = RunnerError("error loading model: tensor 'token_embd.weight' not found")
        error.cause = "corrupt or unsupported model file"
        raise error

    sched = Scheduler(launch, default_keep_alive=300, heal_base=0.01)  # cool-downs 0.05 s .. 0.6 s
    with pytest.raises(RunnerError):  # the first try fails the request that asked for it
        await sched.acquire(plan(), keep_alive=math.inf)
    await until(lambda: (f := sched.healer.failures.get(plan().key)) is not None and f.broken)
    await asyncio.sleep(0.05)  # past any further backoff: nothing retries once the breaker is open
    assert len(attempts) == healing.BREAKER_AFTER and sched.snapshot() == []
    with pytest.raises(ServiceUnavailable) as caught:  # requests meanwhile spawn nothing either
        await sched.acquire(plan())
    assert "breaker open" in caught.value.message and len(attempts) == healing.BREAKER_AFTER
    await sched.close()


async def test_unloading_a_failing_pinned_model_cancels_its_retry(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300, heal_base=0.01)  # first retry after 0.05 s
    launcher.fail_with = RunnerError("exited")
    with pytest.raises(RunnerError):
        await sched.acquire(plan(), keep_alive=math.inf)
    assert await sched.unload(plan().reference) is False  # not loaded, but its failures are forgotten
    launcher.entered.clear()
    await asyncio.sleep(0.2)  # past the retry it had scheduled
    assert not launcher.entered.is_set() and sched.snapshot() == []
    await sched.close()


async def test_unpinned_model_that_fails_to_load_is_not_retried_by_itself(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300, heal_base=0.001)
    launcher.fail_with = RunnerError("exited")
    with pytest.raises(RunnerError):
        await sched.acquire(plan())
    launcher.entered.clear()
    await asyncio.sleep(0.05)
    assert not launcher.entered.is_set()
    await sched.close()


async def test_out_of_memory_load_is_retried_once_with_half_the_context() -> None:
    contexts: list[int] = []
    inner = FakeLauncher()

    async def launch(p, on_exit):  # type: ignore[no-untyped-def]
        contexts.append(p.n_ctx)
        if p.n_ctx > 1024:
            error = RunnerError("failed to allocate buffer for kv cache")
            error.cause = "out of memory"
            raise error
        return await inner(p, on_exit)

    sched = Scheduler(launch, default_keep_alive=300)
    lease = await sched.acquire(plan(n_ctx=2048))
    assert contexts == [2048, 1024] and sched.snapshot()[0].n_ctx == 1024
    lease.release()
    (await sched.acquire(plan(n_ctx=2048))).release()  # the same context again: no reload, no second OOM
    assert contexts == [2048, 1024]
    with pytest.raises(RunnerError):  # 8192 -> 4096 still does not fit: one retry only
        await sched.acquire(plan("docker.io/ai/b:1", n_ctx=8192))
    assert contexts[2:] == [8192, 4096]
    await sched.close()
