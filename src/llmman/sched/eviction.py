"""Which loaded models to unload to make room for another: a pure policy, table-tested.

Rules (docs/memory.md; improving on Ollama's shortest-keep_alive-first, ``server/sched.go``):

1. Tiers, tried in order: idle and unpinned; busy and unpinned; idle and pinned; busy and pinned.
   Pinned = ``keep_alive`` < 0 (kept forever) or pinned by a preset. A busy model is never cut: the
   caller marks it and waits for its in-flight requests to drain.
2. Within the reach of a tier, if one model frees enough on its own (together with those already
   chosen), take the one of those with the least expected reload cost (its weight bytes: reloading
   reads them again). Otherwise take the tier's biggest model and go on.
3. Enough means ``need_bytes`` freed and ``need_count`` models gone (``LLMMAN_MAX_LOADED_MODELS``).

If even every candidate does not free enough, all are returned; the caller has already checked that
the new model fits the node when it is alone.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Candidate", "choose_victims"]


@dataclass(frozen=True)
class Candidate:
    """A loaded model that could be unloaded.

    Attributes:
        reference: its table key.
        size: bytes it frees when unloaded.
        busy: requests are in flight (it must drain first).
        pinned: ``keep_alive`` < 0 or a preset pin.
        reload_cost: what reloading it later costs, in bytes to read (its weights).
    """

    reference: str
    size: int
    busy: bool = False
    pinned: bool = False
    reload_cost: int = 0


def _tier(c: Candidate) -> int:
    return 2 * int(c.pinned) + int(c.busy)


def choose_victims(candidates: list[Candidate], *, need_bytes: int, need_count: int = 0) -> list[str]:
    """The references to unload, in order, to free ``need_bytes`` bytes and ``need_count`` models.

    Returns [] when nothing needs to go (both needs <= 0).
    """
    chosen: list[Candidate] = []
    freed = 0
    for tier in range(4):
        pool = sorted((c for c in candidates if _tier(c) == tier), key=lambda c: (-c.size, c.reference))
        while pool and (freed < need_bytes or len(chosen) < need_count):
            count_left = need_count - len(chosen)
            enough = [c for c in pool if freed + c.size >= need_bytes and count_left <= 1]
            pick = min(enough, key=lambda c: (c.reload_cost, c.size, c.reference)) if enough else pool[0]
            pool.remove(pick)
            chosen.append(pick)
            freed += pick.size
        if freed >= need_bytes and len(chosen) >= need_count:
            break
    return [c.reference for c in chosen]
