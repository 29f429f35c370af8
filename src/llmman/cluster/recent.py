"""A short memory of where models were seen loaded, so a burst of requests does not probe every time.

When a probe finds a model loaded on a peer (placement rule 1), the next requests for it within
:data:`LOADED_TTL_S` go straight to that peer without asking every peer again. The entry is dropped
when the peer fails (a failed forward or mid-answer break marks it down), when it answers an error,
when the model is unloaded through this node, and when the time is up; the next request then probes as
usual. Entries are only ever set by a probe, never refreshed by use, so the figures behind a decision
are never older than the TTL.

With the background refresh of the peers' state (cluster/peers.py, ``aggregation.refresh``) a decision
rarely probes at all, so this memory saves little more than reading those views; it stays because the
router reads it (a shortcut that skips even building the views).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from llmman.config.table import HostAddress

LOADED_TTL_S = 2.0


class RecentLoaded:
    """Model reference (lower-cased) -> the peer a probe saw it loaded on, for ``ttl`` seconds.

    Args:
        ttl: seconds an entry is trusted; 0 turns the memory off.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, ttl: float = LOADED_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._seen: dict[str, tuple[HostAddress, float]] = {}

    def put(self, ref: str, peer: HostAddress) -> None:
        """Remember that a probe just found ``ref`` loaded on ``peer``."""
        if self.ttl > 0:
            self._seen[ref.lower()] = (peer, self._clock())

    def get(self, ref: str) -> tuple[HostAddress, float] | None:
        """``(peer, seconds since the probe)`` while the entry is fresh, else None (and it is dropped)."""
        entry = self._seen.get(ref.lower())
        if entry is None:
            return None
        age = self._clock() - entry[1]
        if age >= self.ttl:
            self._seen.pop(ref.lower(), None)
            return None
        return entry[0], age

    def forget(self, ref: str) -> None:
        """Drop what is known about ``ref``."""
        self._seen.pop(ref.lower(), None)

    def forget_peer(self, peer: HostAddress) -> None:
        """Drop every entry pointing at ``peer`` (it failed)."""
        for ref in [r for r, (p, _) in self._seen.items() if p == peer]:
            del self._seen[ref]
