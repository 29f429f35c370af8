"""The /health watchdog: notices a READY llama-server child that stopped answering (hung).

A crashed child is seen at once (its exit wakes :class:`~llmman.runner.process.LlamaServerProcess`),
but a hung one (deadlocked, stopped by SIGSTOP, stuck in the driver) keeps its process and socket and
would hold its requests forever. So while a child is READY its own process object runs :func:`watch`:
``GET /health`` every ``interval`` seconds with a short timeout. Any HTTP answer, whatever its status,
proves the child is alive. But an unanswered probe does not prove it hung: under load (64 concurrent
streams) llama-server's HTTP threads are all busy and ``/health`` waits 30-50 s for one while tokens
keep flowing. So liveness is judged by progress too: any byte arriving from the child on an open
upstream exchange (llmman.gateway.UpstreamExchange), and any output on its stdout/stderr, count as
much as an answer (``progress``, a monotonic time, passed to :func:`watch`). The child counts as hung
only after ``failures`` consecutive unanswered probes (timeout or refused connection) *and* no answer
and no progress for as long (:func:`is_stalled`): a SIGSTOPped or deadlocked child answers nothing and
makes no progress, so it is still caught. Then ``on_hung`` is called once with the reason,
``hung (no /health answer for X s, no progress for Y s)``; the process object SIGKILLs the child's
process group and its normal exit path forgets or restarts it (scheduler) and fails its requests.

The decisions are the pure functions :func:`probe_timeout`, :func:`next_failures`, :func:`is_hung`,
:func:`is_stalled` and :func:`hung_reason` (tests/unit/test_runner_health.py); :func:`watch` only
does the I/O.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

__all__ = ["WatchdogPolicy", "hung_reason", "is_hung", "is_stalled", "next_failures", "probe_timeout",
           "watch"]

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


def is_stalled(failures: int, policy: WatchdogPolicy, quiet_for: float) -> bool:
    """Hung for good: :func:`is_hung` and, for ``quiet_for`` seconds, no answer and no progress at
    all, for at least as long as the unanswered probes can take (``max(interval, timeout) *
    failures``: 30 s by default; a pause in the tokens, such as a batch of new prompts being
    processed or a busy machine, is not a hang)."""
    span = max(policy.interval, policy.timeout) * max(1, policy.failures)
    return is_hung(failures, policy) and quiet_for >= span


def hung_reason(silent_for: float, quiet_for: float | None = None) -> str:
    """The failure cause users see: ``hung (no /health answer for 31 s)`` (``silent_for`` in seconds),
    with ``, no progress for 12 s`` when progress was watched too (``quiet_for``)."""
    progress = "" if quiet_for is None else f", no progress for {quiet_for:.0f} s"
    return f"hung (no /health answer for {silent_for:.0f} s{progress})"


async def _probe(session: aiohttp.ClientSession, url: str) -> bool:
    """True when ``url`` answered at all (any status) within the session's timeout."""
    try:
        async with session.get(url) as resp:
            await resp.read()
            return True
    except (aiohttp.ClientError, TimeoutError):
        return False


async def watch(base_url: str, policy: WatchdogPolicy, on_hung: Callable[[str], None],
                progress: Callable[[], float] | None = None) -> None:
    """Probe ``base_url``/health per ``policy`` until the child counts as hung, then call ``on_hung``
    once with :func:`hung_reason` and return. Runs forever otherwise: the owner cancels it when the
    child exits or is stopped. Returns at once when the policy is disabled.

    Args:
        progress: the loop time (``loop.time()``) of the child's latest progress (bytes relayed from
            it, its output); with it, unanswered probes alone never mean hung (:func:`is_stalled`).
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
            now = loop.time()
            if answered:
                last_answer = now
            elif progress is None:
                if is_hung(failures, policy):
                    on_hung(hung_reason(now - last_answer))
                    return
            else:
                quiet_for = now - max(last_answer, progress())
                if is_stalled(failures, policy, quiet_for):
                    on_hung(hung_reason(now - last_answer, quiet_for))
                    return
