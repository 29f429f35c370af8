"""The entries of the scheduler's table of loaded models, the views of them, and the leases on them.

:class:`LoadedModel` is one mutable entry (owned by llmman.sched.scheduler.Scheduler); :class:`LoadedSnapshot`
is its read-only view for ``/api/ps``, ``llmman ps`` and ``/llmman/node`` (:func:`snapshot_of`);
a :class:`Lease` is one request's hold on an entry.
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from llmman.sched.devices import Placement
from llmman.sched.plan import ModelPlan, Runner


@dataclass
class LoadedModel:
    """One entry of the table. Mutable; owned by the scheduler."""

    plan: ModelPlan
    keep_alive: float
    runner: Runner | None = None
    refcount: int = 0
    started_at: float = 0.0
    expires_at: float | None = None
    load_task: asyncio.Task[Runner] | None = None
    timer: asyncio.TimerHandle | None = None
    unload_when_idle: bool = False  # a stop (keep_alive 0) came while busy: draining, nobody new joins
    admitted: bool = False  # counted against the node's memory
    evicting: bool = False  # chosen to make room: unload when idle, whatever keep_alive says
    usage_host: int = 0  # bytes llama-server reported after loading (0 = not reported)
    usage_device: int = 0
    oom_ctx: int = 0  # the context that ran out of memory (plan.n_ctx is then the smaller one that fit)
    sharers: set[str] = field(default_factory=set)  # other table keys served by this child (ModelPlan.child)
    restarted: bool = False  # loaded again by the scheduler after a crash (sched.healing): nobody asked
    stopping: asyncio.Task[None] | None = None  # the stop of its child; the entry stays until it has exited
    held_back: int = 0  # requests waiting for this draining entry to go, to load the model afresh
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # set once it has left the table
    # Request fingerprints (Lease.request) now in flight, and those cut by a broken child connection:
    # the suspects when this child crashes (llmman.sched.healing).
    inflight: collections.Counter[str] = field(default_factory=collections.Counter)
    broken: set[str] = field(default_factory=set)

    def suspects(self) -> set[str]:
        """The fingerprints of the requests in flight, or cut short, on this entry's child."""
        return {fp for fp, n in self.inflight.items() if n > 0} | self.broken

    @property
    def leaving(self) -> bool:
        """True once it is to unload (a stop, or its child is stopping): a new request waits for it to go."""
        return self.unload_when_idle or self.stopping is not None

    @property
    def ready(self) -> bool:
        """True once the child answered ``/health`` with 200."""
        return self.runner is not None

    @property
    def memory(self) -> int:
        """Bytes this model takes: llama-server's own figure once loaded, else the estimate."""
        measured = self.usage_host + self.usage_device
        return measured if measured else self.plan.estimate


@dataclass(frozen=True)
class LoadedSnapshot:
    """A read-only view of one loaded model, for ``/api/ps`` and ``llmman ps``.

    Times are unix seconds; ``expires_at`` is None for a model kept forever.
    """

    reference: str
    digest: str
    size: int
    n_ctx: int
    started_at: float
    expires_at: float | None
    refcount: int  # requests on it: served, waiting for a slot or the load, or held back while it drains
    ready: bool
    pid: int | None
    memory: int = 0
    memory_device: int = 0
    embedding: bool = False  # an ``--embeddings`` child, beside any chat child of the same model
    slots: int = 0  # llama-server slots (``-np``): requests served at once, the rest wait in its queue
    draining: bool = False  # it goes when the requests in flight finish (a stop, an eviction, stopping now)
    placement: Placement | None = None  # its devices on a GPU node (ModelPlan.placement)

    @property
    def in_flight(self) -> int:
        """Requests being served now: those holding a lease, up to the slots, once the child is ready."""
        return min(self.refcount, self.slots) if self.ready else 0

    @property
    def queued(self) -> int:
        """Requests holding a lease that wait for a free slot or for the load."""
        return self.refcount - self.in_flight


class Lease:
    """A hold on a loaded model. Release it exactly once (``async with`` does it).

    Attributes:
        base_url: the child's ``http://127.0.0.1:PORT``.
        reference: the canonical reference of the model.
        load_duration: seconds spent waiting for the model (queue + load), for Ollama's
            ``load_duration``.
        request: the fingerprint of the request this lease serves (the gateway's), or None.
    """

    def __init__(self, release: Callable[[LoadedModel], None], entry: LoadedModel, runner: Runner,
                 load_duration: float, request: str | None = None) -> None:
        self._release = release
        self._entry = entry
        self.base_url = runner.base_url
        self.reference = entry.plan.reference
        self.load_duration = load_duration
        self.runner = runner
        self.request = request
        self._released = False
        self._progressed: Callable[[], None] | None = getattr(runner, "progressed", None)
        if request is not None:
            entry.inflight[request] += 1

    def progressed(self) -> None:
        """Bytes came from the child for this lease: it is alive (runner.health's progress)."""
        if self._progressed is not None:
            self._progressed()

    def broke(self) -> None:
        """The connection to the child broke under this request (a crash is then suspected of it)."""
        if self.request is not None:
            self._entry.broken.add(self.request)

    def release(self) -> None:
        """Drop the hold; starts the keep-alive timer when it was the last one. Idempotent."""
        if not self._released:
            self._released = True
            if self.request is not None:
                self._entry.inflight[self.request] -= 1
                if self._entry.inflight[self.request] <= 0:
                    del self._entry.inflight[self.request]
            self._release(self._entry)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


def snapshot_of(entry: LoadedModel, now: float) -> LoadedSnapshot:
    """``entry`` as seen at unix time ``now``: a busy or loading model shows ``expires_at`` = now +
    keep_alive, as Ollama does; a model kept forever shows None."""
    expires: float | None
    if math.isinf(entry.keep_alive):
        expires = None
    elif entry.expires_at is not None:
        expires = entry.expires_at
    else:
        expires = now + max(entry.keep_alive, 0.0)
    return LoadedSnapshot(
        reference=entry.plan.reference,
        digest=entry.plan.digest,
        size=entry.plan.size,
        n_ctx=entry.plan.n_ctx,
        started_at=entry.started_at or now,
        expires_at=expires,
        refcount=entry.refcount + entry.held_back,
        ready=entry.ready,
        pid=entry.runner.pid if entry.runner is not None else None,
        memory=entry.memory,
        memory_device=entry.usage_device,
        embedding=entry.plan.embedding,
        slots=entry.plan.n_parallel,
        placement=entry.plan.placement,
        draining=entry.leaving or entry.evicting,
    )
