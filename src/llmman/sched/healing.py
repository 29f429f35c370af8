"""Self-healing policy: cool-downs after failed loads, restart backoff, and the crash breaker.

Pure decisions, no I/O; the scheduler calls them (llmman.sched.scheduler, llmman.sched.failures) and the
tests drive them with a fake clock (tests/unit/test_healing.py). Times are monotonic seconds.

Rules (issue 4 item 6; llama-swap and Ollama both leave a crashing model to be respawned by every
request, which is what these rules prevent):

- Every failure of a model (a failed load, or a crash while serving) is recorded with its classified
  cause (runner.crash). Failures count up; a failure after the model had served for at least
  :data:`STABLE_S` seconds counts as the first again.
- After failure number ``n`` the model cools down for ``backoff(n) = min(base * 2**(n-1), CAP_S)``
  seconds (``base`` = LOAD_BASE_S after a failed load, BASE_S after a crash while serving). After a
  failed load, requests meanwhile get 503 with ``Retry-After`` (the remaining seconds, rounded up) and
  no child is spawned; after a crash a request may reload at once. A successful load ends the
  cool-down but keeps the count.
- A pinned (keep_alive < 0) or busy model that crashes while serving is restarted by the scheduler
  after ``backoff(n)``, unless the breaker is open: after :data:`BREAKER_AFTER` failures in a row
  nothing restarts it by itself any more (requests still try once per cool-down of CAP_S seconds).
- An out-of-memory load is retried once at once with half the context (never below MIN_CTX tokens).
- A request is never replayed once it reached a child (llmman.gateway.Gateway.open). Every request in
  flight on a child when it died (or cut by its death) is a *suspect* of that crash, named by its
  fingerprint (the route and body bytes). A fingerprint suspected of :data:`POISON_AFTER` crashes
  within :data:`POISON_WINDOW_S` seconds of each other is a poison request: the same bytes are refused
  with 503 and ``Retry-After`` for ``backoff(strikes - POISON_AFTER + 1, POISON_BASE_S)`` seconds
  without reaching the child, so one client repeating it cannot keep taking the model down for
  everyone. Other requests are not affected (a crash still counts toward the model's breaker, but a
  refused request causes none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BASE_S = 1.0  # first restart delay after a crash while serving, seconds
LOAD_BASE_S = 5.0  # first cool-down after a failed load, seconds (such failures rarely fix themselves)
CAP_S = 60.0  # longest cool-down, seconds
STABLE_S = 60.0  # served this long without failing: the failure count starts again
BREAKER_AFTER = 5  # failures in a row after which automatic restarts stop
MIN_CTX = 256  # smallest context an out-of-memory retry goes down to, tokens
POISON_AFTER = 2  # crashes a request was in flight for before it is refused
POISON_WINDOW_S = 600.0  # a suspicion older than this (since its last crash) is forgotten, seconds
POISON_BASE_S = 60.0  # first refusal of a poison request, seconds (doubling at each crash after)
POISON_CAP_S = 3600.0  # longest refusal of a poison request, seconds


def backoff(failures: int, base: float = BASE_S) -> float:
    """Seconds to wait after the ``failures``-th failure in a row (1 -> ``base``, doubling, <= CAP_S)."""
    if failures <= 0:
        return 0.0
    return min(base * 2.0 ** min(failures - 1, 32), CAP_S)


def retry_after(remaining: float) -> int:
    """A ``Retry-After`` header value for ``remaining`` seconds: whole seconds, at least 1."""
    return max(1, math.ceil(remaining))


def smaller_context(n_ctx: int) -> int | None:
    """The context for the one out-of-memory retry: half of ``n_ctx``, or None when that would go
    below MIN_CTX tokens (then the model simply does not fit)."""
    half = n_ctx // 2
    return half if half >= MIN_CTX else None


@dataclass
class Failure:
    """What went wrong with one model, kept while it matters.

    Attributes:
        cause: runner.crash.Cause value (``out of memory``, ``bad argument``, ...).
        message: the error text (with the child's last lines).
        count: failures in a row.
        until: monotonic time the cool-down ends.
        while_serving: the last failure was a crash after the model was ready (not a failed load).
    """

    cause: str
    message: str
    count: int
    until: float
    while_serving: bool = False

    @property
    def broken(self) -> bool:
        """True once the breaker is open (BREAKER_AFTER failures in a row)."""
        return self.count >= BREAKER_AFTER

    def reason(self) -> str:
        """One line for ``/api/ps``, ``llmman ps`` and the log."""
        what = "crashed" if self.while_serving else "failed to load"
        state = "; stopped restarting it (breaker open)" if self.broken else ""
        return f"{what} {self.count} time(s) in a row: {self.cause}{state}"


def record(previous: Failure | None, *, cause: str, message: str, now: float, uptime: float | None
           ) -> Failure:
    """The new failure record after a failure at ``now``.

    Args:
        previous: the model's record, or None.
        uptime: seconds the model had been serving before it crashed, None for a failed load.
    """
    stable = uptime is not None and uptime >= STABLE_S
    count = 1 if previous is None or stable else previous.count + 1
    base = BASE_S if uptime is not None else LOAD_BASE_S
    return Failure(cause=cause, message=message, count=count, until=now + backoff(count, base),
                   while_serving=uptime is not None)


def should_restart(failure: Failure, *, pinned: bool, busy: bool) -> bool:
    """Restart a model that crashed while serving by itself? Only pinned or busy ones, breaker shut."""
    return (pinned or busy) and not failure.broken


@dataclass
class Suspicion:
    """One request fingerprint's share in a model's crashes.

    Attributes:
        strikes: crashes it was in flight for, within POISON_WINDOW_S of each other.
        last: monotonic time of the latest of them.
        cause: the latest crash's cause.
    """

    strikes: int
    last: float
    cause: str

    def refused_until(self, scale: float = 1.0) -> float:
        """Monotonic time until which the request is refused (``last`` when it is not poison)."""
        if self.strikes < POISON_AFTER:
            return self.last
        n = self.strikes - POISON_AFTER + 1
        return self.last + min(POISON_BASE_S * 2.0 ** min(n - 1, 32), POISON_CAP_S) * scale


def suspect(previous: Suspicion | None, *, cause: str, now: float, scale: float = 1.0) -> Suspicion:
    """The record after one more crash with the request in flight (a stale one starts again)."""
    if previous is None or now - previous.last > POISON_WINDOW_S * scale:
        return Suspicion(strikes=1, last=now, cause=cause)
    return Suspicion(strikes=previous.strikes + 1, last=now, cause=cause)
