"""Which node served a conversation, so its next turns go there too (llama-server's prompt cache).

A conversation is named by its key (:func:`llmman.protocol.conversation.conversation_key`, computed by
each chat route); the router remembers key -> node name for every chat it places and, while that node's
copy takes requests without queueing, sends the next turn there (docs/aggregation.md#spreading-and-replicas).
The memory is bounded (the entries set longest ago go first) and each entry expires ``ttl`` seconds after
the turn that set it — the daemon passes ``server.keep_alive``, after which the node's copy, and so its
cache, may be gone.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

SIZE = 4096


class Affinity:
    """Conversation key -> the node that served its last turn (``local`` or a peer name).

    Args:
        ttl: seconds an entry lives after it was set; 0 or less = until pushed out by newer ones.
        size: the most entries kept.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, ttl: float, size: int = SIZE, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.size = size
        self._clock = clock
        self._nodes: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, key: str) -> str | None:
        """The node that served ``key`` last, or None (unknown or expired: the entry is dropped)."""
        entry = self._nodes.get(key)
        if entry is None:
            return None
        if self.ttl > 0 and self._clock() - entry[1] >= self.ttl:
            del self._nodes[key]
            return None
        return entry[0]

    def put(self, key: str, node: str) -> None:
        """``node`` serves ``key`` now; the oldest entry goes when the memory is full."""
        self._nodes[key] = (node, self._clock())
        self._nodes.move_to_end(key)
        while len(self._nodes) > self.size:
            self._nodes.popitem(last=False)
