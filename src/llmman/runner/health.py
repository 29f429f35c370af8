"""The /health watchdog: notices a READY llama-server child that stopped answering (hung).

A crashed child is seen at once (its exit wakes :class:`~llmman.runner.process.LlamaServerProcess`),
but a hung one (deadlocked, stopped by SIGSTOP, stuck in the driver) keeps its process and socket and
would hold its requests forever. So while a child is READY its own process object runs :func:`watch`:
``GET /health`` every ``interval`` seconds with a short timeout. Any HTTP answer, whatever its status,
proves the child's HTTP thread is alive (llama-server answers ``/health`` from its own thread even when
every slot is busy decoding, so a busy child is never taken for a hung one). After ``failures``
consecutive probes without an answer (timeout or refused connection), ``on_hung`` is called once with
the reason, ``hung (no /health answer for X s)``; the process object then SIGKILLs the child's process
group and its normal exit path forgets or restarts it (scheduler) and fails its in-flight requests.

The decisions are the pure functions :func:`probe_timeout`, :func:`next_failures`, :func:`is_hung`
and :func:`hung_reason` (tests/unit/test_runner_health.py); :func:`watch` only does the I/O.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

__all__ = ["WatchdogPolicy", "hung_reason", "is_hung", "next_failures", "probe_timeout", "watch"]

_MIN_PROBE_TIMEOUT = 1.0  # seconds: a loaded machine may take a moment to answer even a healthy probe
_MAX_PROBE_TIMEOUT = 5.0  # seconds: "short" -- a healthy llama-server answers /health in milliseconds
DEFAULT_FAILURES = 3  # consecutive unanswered probes that mean "hung"


@dataclass(frozen=True)
class WatchdogPolicy:
    """How the watchdog probes one child.

    Attributes:
        interval: seconds between the starts of two probes; 0 or infinite = no watchdog.
        failures: consecutive unanswered probes after which the child counts as hung (at least 1).
    """

    interval: float
    failures: int = DEFAULT_FAILURES

    @property
    def enabled(self) -> bool:
        return self.interval > 0 and math.isfinite(self.interval)

    @property
    def timeout(self) -> float:
        """Seconds one probe may take (see :func:`probe_timeout`)."""
        return probe_timeout(self.interval)


def probe_timeout(interval: float) -> float:
    """Seconds one ``GET /health`` may take: the interval, clamped to 1..5 s."""
    return min(max(interval, _MIN_PROBE_TIMEOUT), _MAX_PROBE_TIMEOUT)


def next_failures(previous: int, answered: bool) -> int:
    """Consecutive unanswered probes after one more probe: any answer resets the count to 0."""
    return 0 if answered else previous + 1


def is_hung(failures: int, policy: WatchdogPolicy) -> bool:
    """True once ``failures`` consecutive probes went unanswered, per ``policy.failures``."""
    return failures >= max(1, policy.failures)


def hung_reason(silent_for: float) -> str:
    """The failure cause users see: ``hung (no /health answer for 31 s)`` (``silent_for`` in seconds)."""
    return f"hung (no /health answer for {silent_for:.0f} s)"


async def _probe(session: aiohttp.ClientSession, url: str) -> bool:
    """True when ``url`` answered at all (any status) within the session's timeout."""
    try:
        async with session.get(url) as resp:
            await resp.read()
            return True
    except (aiohttp.ClientError, TimeoutError):
        return False


async def watch(base_url: str, policy: WatchdogPolicy, on_hung: Callable[[str], None]) -> None:
    """Probe ``base_url``/health per ``policy`` until the child counts as hung, then call ``on_hung``
    once with :func:`hung_reason` and return. Runs forever otherwise: the owner cancels it when the
    child exits or is stopped. Returns at once when the policy is disabled.
    """
    if not policy.enabled:
        return
    loop = asyncio.get_running_loop()
    url = base_url + "/health"
    timeout = aiohttp.ClientTimeout(total=policy.timeout)
    connector = aiohttp.TCPConnector(force_close=True)  # a fresh connection per probe, never a stale one
    failures = 0
    last_answer = loop.time()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        while True:
            await asyncio.sleep(policy.interval)
            answered = await _probe(session, url)
            failures = next_failures(failures, answered)
            if answered:
                last_answer = loop.time()
            elif is_hung(failures, policy):
                on_hung(hung_reason(loop.time() - last_answer))
                return
