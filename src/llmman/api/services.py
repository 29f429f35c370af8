"""The services a request handler may use, passed to the app at construction (no singletons)."""

from __future__ import annotations

from dataclasses import dataclass

from llmman.cluster.peers import Peers
from llmman.config.settings import Settings
from llmman.gateway import Gateway
from llmman.registry.puller import Puller
from llmman.sched.scheduler import Scheduler
from llmman.store import Store


@dataclass(frozen=True)
class Services:
    """Everything the route handlers need: settings, the store, the scheduler and the gateway."""

    settings: Settings
    store: Store
    scheduler: Scheduler
    gateway: Gateway
    puller: Puller | None = None  # pulls and pushes (issue 3); None in tests that need no registry
    peers: Peers | None = None  # the aggregation (issue 5); None or empty = a node on its own
