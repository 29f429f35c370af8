"""The watchdog's pure decisions (runner.health) and its probe loop against a local HTTP server."""

from __future__ import annotations

import asyncio
import math

import pytest
from aiohttp import web

from llmman.runner.health import WatchdogPolicy, hung_reason, is_hung, next_failures, probe_timeout, watch


@pytest.mark.parametrize(
    ("interval", "timeout"), [(0.1, 1.0), (1.0, 1.0), (3.0, 3.0), (10.0, 5.0), (60.0, 5.0)]
)
def test_probe_timeout_is_the_interval_clamped_to_1_to_5_s(interval: float, timeout: float) -> None:
    assert probe_timeout(interval) == timeout


@pytest.mark.parametrize(
    ("previous", "answered", "after"), [(0, True, 0), (2, True, 0), (0, False, 1), (2, False, 3)]
)
def test_next_failures_counts_unanswered_probes_in_a_row(previous: int, answered: bool, after: int) -> None:
    assert next_failures(previous, answered) == after


@pytest.mark.parametrize(("failures", "policy", "hung"), [
    (2, WatchdogPolicy(10.0), False),
    (3, WatchdogPolicy(10.0), True),
    (1, WatchdogPolicy(10.0, failures=1), True),
    (1, WatchdogPolicy(10.0, failures=0), True),  # at least one probe, never "hung" before any
    (0, WatchdogPolicy(10.0, failures=0), False),
])  # fmt: skip
def test_is_hung_after_k_failures(failures: int, policy: WatchdogPolicy, hung: bool) -> None:
    assert is_hung(failures, policy) is hung


@pytest.mark.parametrize(
    ("interval", "enabled"), [(0.0, False), (-1.0, False), (math.inf, False), (0.5, True)]
)
def test_zero_negative_or_infinite_interval_is_off(interval: float, enabled: bool) -> None:
    assert WatchdogPolicy(interval).enabled is enabled


def test_hung_reason_names_the_silence_in_seconds() -> None:
    assert hung_reason(31.4) == "hung (no /health answer for 31 s)"


async def test_watch_reports_hung_once_answers_stop_and_ignores_status_codes() -> None:
    """503 is an answer (alive); a closed port is not: three refused probes -> on_hung once."""
    answered = asyncio.Event()

    async def health(_: web.Request) -> web.Response:
        answered.set()
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    reasons: list[str] = []
    hung = asyncio.Event()

    def on_hung(reason: str) -> None:
        reasons.append(reason)
        hung.set()

    task = asyncio.create_task(watch(f"http://127.0.0.1:{port}", WatchdogPolicy(0.05), on_hung))
    await answered.wait()
    assert not hung.is_set()
    await runner.cleanup()  # the "child" stops answering
    await asyncio.wait_for(hung.wait(), 30)
    await task  # returns after reporting
    assert len(reasons) == 1 and reasons[0].startswith("hung (no /health answer for ")


async def test_disabled_watch_returns_at_once() -> None:
    await watch("http://127.0.0.1:9", WatchdogPolicy(0.0), lambda _: pytest.fail("called"))
