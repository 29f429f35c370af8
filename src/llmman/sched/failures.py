"""The scheduler's memory of failures: cool-downs, restarts and the breaker (rules in llmman.sched.healing).

:class:`Healer` keeps one :class:`~llmman.sched.healing.Failure` per table key, refuses requests for a model
that is cooling down (503 with ``Retry-After`` instead of a child per request), logs each failure with
its classified cause, and runs the delayed restarts the scheduler asks for. It also keeps the
requests suspected of crashing a model (:class:`~llmman.sched.healing.Suspicion`, by fingerprint) and
refuses a poison one (:meth:`Healer.check_request`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from llmman.errors import ServiceUnavailable
from llmman.sched import healing
from llmman.sched.healing import Failure, Suspicion

log = logging.getLogger("llmman.sched.scheduler")


class Healer:
    """Failure records and restart tasks of one scheduler.

    Args:
        base: seconds of the first cool-down (healing.BASE_S; tests use less).
        clock: monotonic seconds (injected for tests).
    """

    def __init__(self, *, base: float = healing.BASE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._scale = base / healing.BASE_S
        self._clock = clock
        self.failures: dict[str, Failure] = {}
        self.suspects: dict[str, dict[str, Suspicion]] = {}  # table key -> request fingerprint -> record
        self._tasks: set[asyncio.Task[None]] = set()

    def check(self, key: str, reference: str) -> None:
        """Raise 503 with ``Retry-After`` while ``key`` cools down after a failed load; else return.

        Raises:
            ServiceUnavailable: code ``model_cooling_down``, naming the cause and the retry time.
        """
        failure = self.failures.get(key)
        if failure is None or failure.while_serving:  # after a crash a request may reload at once
            return
        remaining = failure.until - self._clock()
        if remaining > 0:
            wait = healing.retry_after(remaining)
            raise ServiceUnavailable(
                f"model {reference} {failure.reason()}; not retrying for {wait} s: {failure.message}",
                code="model_cooling_down", retry_after=wait,
            )  # fmt: skip

    def check_request(self, key: str, fingerprint: str | None, reference: str) -> None:
        """Refuse a request whose fingerprint crashed ``key``'s child too often (healing rules).

        Raises:
            ServiceUnavailable: code ``request_crashed_model``, with ``Retry-After``.
        """
        if fingerprint is None:
            return
        suspicion = self.suspects.get(key, {}).get(fingerprint)
        if suspicion is None:
            return
        remaining = suspicion.refused_until(self._scale) - self._clock()
        if remaining > 0:
            wait = healing.retry_after(remaining)
            raise ServiceUnavailable(
                f"this request was in flight each time llama-server for {reference} crashed "
                f"({suspicion.strikes} times, last: {suspicion.cause}); it is not sent again for {wait} s",
                code="request_crashed_model", retry_after=wait,
            )  # fmt: skip

    def suspected(self, key: str, fingerprints: set[str], *, cause: str) -> None:
        """``key``'s child crashed with the requests ``fingerprints`` in flight (or cut by it)."""
        now = self._clock()
        known = self.suspects.setdefault(key, {})
        for fingerprint, suspicion in list(known.items()):  # forget what no longer matters
            if suspicion.refused_until(self._scale) < now and \
                    now - suspicion.last > healing.POISON_WINDOW_S * self._scale:
                del known[fingerprint]
        for fingerprint in fingerprints:
            suspicion = healing.suspect(known.get(fingerprint), cause=cause, now=now, scale=self._scale)
            known[fingerprint] = suspicion
            if suspicion.strikes >= healing.POISON_AFTER:
                log.warning("%s: a request was in flight for %d crashes in a row; refusing it for %.0f s",
                            key, suspicion.strikes, suspicion.refused_until(self._scale) - now)

    def _record(self, key: str, *, cause: str, message: str, uptime: float | None) -> Failure:
        failure = healing.record(self.failures.get(key), cause=cause, message=message, now=self._clock(),
                                 uptime=uptime)
        failure.until = self._clock() + (failure.until - self._clock()) * self._scale
        self.failures[key] = failure
        log.warning("%s %s", key, failure.reason())
        return failure

    def failed_load(self, key: str, *, cause: str, message: str) -> Failure:
        """Record a load that failed (the model is not loaded)."""
        return self._record(key, cause=cause, message=message, uptime=None)

    def crashed(self, key: str, *, cause: str, message: str, uptime: float) -> Failure:
        """Record a child that died while serving after ``uptime`` seconds."""
        return self._record(key, cause=cause, message=message, uptime=uptime)

    def loaded(self, key: str) -> None:
        """A load succeeded: the cool-down ends, the count stays (a crash soon after counts on)."""
        failure = self.failures.get(key)
        if failure is not None:
            failure.until = 0.0

    def forget(self, key: str) -> None:
        """Drop ``key``'s record (the model was unloaded on purpose)."""
        self.failures.pop(key, None)

    def delay(self, failure: Failure) -> float:
        """Seconds until ``failure``'s cool-down ends (>= 0)."""
        return max(0.0, failure.until - self._clock())

    def later(self, delay: float, action: Callable[[], Awaitable[None]], name: str) -> None:
        """Run ``action`` after ``delay`` seconds in a tracked task (cancelled by :meth:`close`)."""

        async def run() -> None:
            await asyncio.sleep(delay)
            await action()

        task = asyncio.create_task(run(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel every pending restart."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
