"""``GET /health``'s answer: is this daemon serving? For systemd watchdogs, load balancers, Kubernetes probes.

Cheap on purpose: a flag set when the shutdown begins (:meth:`Health.stop`) and one read of the store's
``index.json`` (a missing store is a fresh one, and fine; an unreadable or corrupt one is not). The node's
models, memory and peers are ``/llmman/node``'s business, not this one's.
"""

from __future__ import annotations

from typing import Any

from llmman.errors import StoreError
from llmman.store import Store


class Health:
    """The daemon's health: serving, draining, shutting down, or a store it cannot read."""

    def __init__(self) -> None:
        self.stopping = False

    def stop(self) -> None:
        """The shutdown began (SIGTERM or SIGINT): from now on the answer is 503."""
        self.stopping = True

    def check(self, store: Store, *, draining: bool = False) -> tuple[int, dict[str, Any]]:
        """The status code and body: 200 ``{"status": "ok"}`` (or ``"draining"``, still serving), else 503
        ``{"status": "shutting down"}`` or ``{"status": "store unreadable", "error": ...}``."""
        if self.stopping:
            return 503, {"status": "shutting down"}
        try:
            store.layout.read_index()
        except (OSError, StoreError) as exc:
            return 503, {"status": "store unreadable", "error": str(exc)}
        return 200, {"status": "draining" if draining else "ok"}
