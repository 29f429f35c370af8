"""The state behind ``spread = replicas``: how long each model's copies have been saturated, and the
requests this node placed on itself that its scheduler does not count yet.

* :class:`Saturation`: another copy of a model is loaded only when every copy on a primary node has been
  saturated (all slots busy, requests waiting; :func:`.placement.saturated_everywhere`) for
  ``aggregation.replica_after`` seconds. The router observes the copies at each decision; "continuously"
  means every decision in that time saw them saturated (one that did not restarts the clock).
* :class:`LocalPending`: a burst of requests is decided before the first of them reaches the scheduler
  (the store and the plan are read in threads in between), so a decision counts the local placements of
  the last moment whose requests still run on top of what the scheduler reports — otherwise the whole
  burst sees the same spare slots here and none is spread (the peers' side of the same accounting is
  ``Peers.forwarding``).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

PENDING_S = 1.0  # how long a local placement may take to reach the scheduler


class Saturation:
    """Per model (reference, case-insensitive): since when every primary copy has been seen saturated.

    Args:
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since: dict[str, float] = {}  # only models saturated now: bounded by the models loaded

    def observe(self, ref: str, saturated: bool, after: float) -> bool:
        """Record what this decision saw; True when the copies have been saturated for ``after`` seconds
        (at once when ``after`` is 0)."""
        key = ref.lower()
        if not saturated:
            self._since.pop(key, None)
            return False
        since = self._since.setdefault(key, self._clock())
        return self._clock() - since >= after

    def held(self, ref: str, after: float) -> bool:
        """What :meth:`observe` last concluded for a saturated ``ref``, without recording anything (a
        decision made again for a request whose first choice failed sees only part of the pool)."""
        since = self._since.get(ref.lower())
        return since is not None and self._clock() - since >= after

    def restart(self, ref: str) -> None:
        """Another copy of ``ref`` was just placed: the next one waits for a whole period again, with
        that copy among those that must stay saturated (not one per request while it loads)."""
        self._since[ref.lower()] = self._clock()


class LocalPending:
    """The requests placed on this node in the last :data:`PENDING_S` seconds that are still running,
    per model, each with the busy figure the scheduler reported when it was placed.

    While a burst is being decided the scheduler's count stays where it was, so the requests it does not
    show yet are the ones placed since: the busy figure a decision uses (:meth:`busy`) is the largest of
    the scheduler's figure now and, for each placement counted, the figure it saw plus the placements
    counted from it on. A placement stops counting when its request has ended (its task is done: it
    reached the scheduler and left, or failed) or the window is over (the scheduler counts it by then), so
    a client sending one short request after another is not counted twice; a request still running and
    already counted by the scheduler is, for at most the window, counted as though it were not — a spread
    request too many, never a burst piled on one node.

    Args:
        window: seconds a placement is counted at most; clock: monotonic seconds.
    """

    def __init__(self, window: float = PENDING_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._placed: dict[str, deque[_Placement]] = {}

    def __len__(self) -> int:
        """How many models have placements held (counted or not yet dropped)."""
        return len(self._placed)

    def busy(self, ref: str, reported: int) -> int:
        """The busy figure to decide on, given the scheduler's ``reported`` one."""
        placed = self._current(ref.lower())
        n = len(placed)
        return max([reported, *(p.reported + n - i for i, p in enumerate(placed))])

    def placed(self, ref: str, reported: int) -> None:
        """One more request for ``ref`` (the current task's) is placed here; the scheduler reported
        ``reported`` busy."""
        key = ref.lower()
        if key in self._placed:
            self._current(key)
        else:  # a model not seen this window: drop every other one's placements that no longer count,
            for other in list(self._placed):  # or a name requested once (a typo, a model no node has)
                self._current(other)  # would be held for good
        try:
            task: asyncio.Task[object] | None = asyncio.current_task()
        except RuntimeError:  # no event loop (a synchronous caller): counted for the window
            task = None
        self._placed.setdefault(key, deque()).append(
            _Placement(self._clock(), reported, None if task is None else weakref.ref(task)))

    def _current(self, key: str) -> deque[_Placement]:
        """The placements of ``key`` still counted (the others dropped; none left: the entry goes)."""
        placed = self._placed.get(key)
        if placed is None:
            return deque()
        horizon = self._clock() - self.window
        kept = deque(p for p in placed if p.at > horizon and p.running())
        if kept:
            self._placed[key] = kept
        else:
            del self._placed[key]
        return kept


@dataclass(frozen=True)
class _Placement:
    """One request placed here: when, what the scheduler reported then, and its task (None: unknown)."""

    at: float
    reported: int
    task: weakref.ref[asyncio.Task[object]] | None

    def running(self) -> bool:
        if self.task is None:
            return True
        task = self.task()
        return task is not None and not task.done()
