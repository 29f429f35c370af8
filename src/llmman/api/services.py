"""The services a request handler may use, passed to the app at construction (no singletons)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmman.cluster.peers import Peers
from llmman.cluster.router import Policy, Router
from llmman.config.settings import Settings
from llmman.gateway import Gateway
from llmman.obs.observer import Observer
from llmman.registry.puller import Puller
from llmman.sched.lending import Lending
from llmman.sched.scheduler import Scheduler
from llmman.store import Store


@dataclass(frozen=True)
class Services:
    """Everything the route handlers need: settings, the store, the scheduler, the gateway and the router
    (built from the others)."""

    settings: Settings
    store: Store
    scheduler: Scheduler
    gateway: Gateway
    puller: Puller | None = None  # pulls and pushes; None in tests that need no registry
    peers: Peers | None = None  # the aggregation; None or empty = a node on its own
    obs: Observer = field(default_factory=Observer)  # request log, metrics, health (llmman.obs.observer)
    lending: Lending | None = None  # the RPC workers lent to peers (llmman.sched.lending); None = none
    router: Router = field(init=False)  # where each request runs, over the others

    def __post_init__(self) -> None:
        router = Router(self.peers, self.scheduler, self.store, self.settings.host, self.settings.aliases,
                        policy=Policy.of(self.settings))
        object.__setattr__(self, "router", router)
