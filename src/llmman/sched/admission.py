"""Admission of models into the node's memory: who must go (or drain) before a model may load.

:class:`Admission` decides, one admission at a time, whether a model fits: its memory (the GGUF
estimate, ``plan.estimate`` bytes) beside the admitted models (each counted at what llama-server reported
after its load, else its estimate) within ``capacity``, and one more model within ``max_loaded``.
Otherwise :func:`llmman.eviction.choose_victims` picks models to unload: idle ones go at once, busy ones
are marked ``evicting`` and unloaded by the scheduler when their last request ends (never cut), and the
admission waits for :meth:`Admission.notify`. A model larger than the whole capacity fails at once,
naming both figures.

On a GPU node (llmman.sched.devices.per_device) the same runs device by device: the model must fit on
the devices it may use (its preset's ``devices``, else all), :func:`llmman.sched.devices.place` picks one
device or a split and the choice goes into the entry's plan (``ModelPlan.placement``); only models with a
part on those devices are candidates to go, each for the bytes it frees there. A model larger than its
devices' share of the capacity fails at once. Host-only and unknown nodes keep the node-wide rule.
A model asked with ``num_gpu`` 0 (``ModelPlan.on_host``: no layer on a GPU) plans no device memory on a
GPU node: it is admitted by the count limit alone and placed on no device.

Memory lent to peers (``ggml-rpc-server`` workers, llmman.sched.lending) is :attr:`Admission.reserved`:
:meth:`Admission.reserve` takes it at once or refuses (507), making room only by unloading idle models
(chosen as for a load, busy ones never: a peer's worker does not wait for this node's requests), and
admission counts it beside the admitted models, so nothing else is admitted into it; on a GPU node it
counts on every device in proportion to its capacity (it has no placement). A model that would fit the
capacity but not what the reservations leave fails at once, like one larger than the capacity.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace

from llmman.errors import LlmmanError
from llmman.sched.devices import (
    DeviceRoom,
    Load,
    Placement,
    allowed_devices,
    frees_on,
    per_device,
    place,
    rooms,
    shortfall,
)
from llmman.sched.eviction import Candidate, choose_victims
from llmman.sched.gpu import NodeMemory
from llmman.sched.table import LoadedModel
from llmman.sizes import format_bytes

log = logging.getLogger("llmman.sched.scheduler")

LENT = "<lent to RPC workers>"  # the reservations' name where devices list what is planned on them


class Admission:
    """The memory and count limits of one node, and the admissions waiting on them.

    Args:
        capacity: bytes models may take on this node (llmman.sched.gpu.NodeMemory.capacity); 0 = no limit.
        max_loaded: most models loaded at once; 0 = no limit but memory.
        node_memory: the node's devices, for admission device by device on a GPU node
            (llmman.sched.devices.per_device); None = ``capacity`` alone.
    """

    def __init__(self, *, capacity: int = 0, max_loaded: int = 0,
                 node_memory: NodeMemory | None = None) -> None:
        self.capacity = capacity
        self.node = node_memory
        self._max_loaded = max_loaded
        self.reserved = 0  # bytes lent to RPC workers of peers (reserve/unreserve)
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()

    async def admit(self, entry: LoadedModel, entries: Callable[[], Iterable[LoadedModel]],
                    unload: Callable[[LoadedModel], Awaitable[None]], closed: Callable[[], bool]) -> None:
        """Make room for ``entry`` (see the module docstring); returns once it is admitted.

        Args:
            entry: the model to admit (its ``admitted`` is set on return).
            entries: the table's entries now (the scheduler's ``table.values``).
            unload: stops an idle victim and drops it from the table (it must :meth:`notify`).
            closed: True once the scheduler shuts down.

        Raises:
            LlmmanError: 500 ``insufficient_memory`` when the model is larger than the whole capacity (on
                a GPU node: than its devices' share of it); 503 when the daemon shuts down meanwhile.
        """
        host_only = entry.plan.on_host and self._per_device()
        need = 0 if host_only else entry.plan.estimate  # num_gpu 0 on a GPU node: no device memory
        allowed = None if host_only else self._allowed(entry, self._rooms([]))
        self._check_alone(entry, need, allowed)
        marked: list[LoadedModel] = []  # the busy models this admission asked to drain for it
        try:
            await self._admit_locked(entry, need, allowed, entries, unload, closed, marked)
        except BaseException:
            # Abandoned (the request's client went away: the load is cancelled) or failed: the models
            # it marked are no longer to go, for nobody; they keep serving and their keep_alive.
            for victim in marked:
                if victim.evicting and victim.stopping is None:
                    log.info("%s no longer needs room: %s stays loaded", entry.plan.reference,
                             victim.plan.reference)
                    victim.evicting = False
            raise

    async def _admit_locked(self, entry: LoadedModel, need: int, allowed: tuple[int, ...] | None,
                            entries: Callable[[], Iterable[LoadedModel]],
                            unload: Callable[[LoadedModel], Awaitable[None]], closed: Callable[[], bool],
                            marked: list[LoadedModel]) -> None:
        """The admission loop of :meth:`admit`, one at a time; each busy model it marks to drain is
        appended to ``marked``."""
        async with self._lock:
            while True:
                if closed():
                    raise LlmmanError("llmman is shutting down", status=503, code="shutting_down")
                if self.reserved:  # a reservation taken while this one waited can leave it no room
                    self._check_alone(entry, need, allowed)
                others = [e for e in entries() if e is not entry and e.admitted]
                placement, short, frees = self._room(entry, need, others, allowed)
                excess = len(others) + 1 - self._max_loaded if self._max_loaded else 0
                if short <= 0 and excess <= 0:
                    if entry.plan.placement != placement:  # a restart's plan carries the old one
                        entry.plan = replace(entry.plan, placement=placement)
                    entry.admitted = True
                    return
                keys = {f"{e.plan.reference}#{i}": e for i, e in enumerate(others)}
                candidates = [
                    Candidate(key, frees(e), busy=e.refcount > 0 or not e.ready,
                              pinned=math.isinf(e.keep_alive), reload_cost=e.plan.size)
                    for key, e in keys.items() if excess > 0 or frees(e) > 0
                ]  # fmt: skip
                changed = self._changed
                unloaded = False
                for key in choose_victims(candidates, need_bytes=short, need_count=excess):
                    victim = keys[key]
                    if victim.ready and victim.refcount == 0:
                        log.info("unloading %s to make room for %s", victim.plan.reference,
                                 entry.plan.reference)
                        await unload(victim)
                        unloaded = True
                    elif not victim.evicting:
                        log.info("%s waits for %s to finish its requests", entry.plan.reference,
                                 victim.plan.reference)
                        victim.evicting = True
                        marked.append(victim)
                if not unloaded:
                    await changed.wait()

    def _per_device(self) -> bool:
        """True on a GPU node, where admission counts device memory (llmman.sched.devices.per_device)."""
        return self.node is not None and per_device(self.node)

    def _rooms(self, others: list[LoadedModel]) -> list[DeviceRoom]:
        """The devices with what ``others`` plan on them ([] when admission is node-wide)."""
        if self.node is None or not per_device(self.node):
            return []
        lent = [Load(LENT, self.reserved, None)] if self.reserved else []
        return rooms(self.node, [*(_load(e) for e in others), *lent])

    def _allowed(self, entry: LoadedModel, room: list[DeviceRoom]) -> tuple[int, ...] | None:
        """The devices ``entry`` may use, or None when it is admitted node-wide (see llmman.sched.devices)."""
        return allowed_devices(room, entry.plan.devices) if room else None

    def _check_alone(self, entry: LoadedModel, need: int, allowed: tuple[int, ...] | None) -> None:
        """Fail at once when ``entry`` cannot fit even with nothing else loaded: on its devices (all of
        them when unpinned) on a GPU node, else in the node's capacity."""
        if allowed is not None:
            room = [r for r in self._rooms([]) if entry.plan.devices is None or r.index in allowed]
            mine, lent = sum(r.capacity for r in room), sum(r.planned for r in room)
            if entry.plan.devices is not None:
                where = f"its devices ({entry.plan.devices}, from its preset) have {format_bytes(mine)}"
            else:
                where = f"this node has {format_bytes(mine)}"
        elif self.capacity:
            mine, lent = self.capacity, self.reserved
            where = f"this node has {format_bytes(mine)}"
        else:
            return
        if need > mine - lent:
            held = f", {format_bytes(lent)} of it lent to RPC workers of peers" if lent else ""
            raise LlmmanError(
                f"model {entry.plan.reference} needs {format_bytes(need)} of memory, but {where} for "
                f"models (resources.memory minus resources.reserve){held}",
                status=500, code="insufficient_memory",
            )  # fmt: skip

    def _room(self, entry: LoadedModel, need: int, others: list[LoadedModel], allowed: tuple[int, ...] | None,
              ) -> tuple[Placement | None, int, Callable[[LoadedModel], int]]:
        """Where ``entry`` would go beside ``others``: its placement (None when node-wide or when it does
        not fit), the bytes still to free (<= 0: it fits), and what unloading each other model frees."""
        node = self.node
        if entry.plan.on_host and self._per_device():  # it plans nothing on the devices: the count only
            return None, 0, lambda e: 0
        if node is None or allowed is None:
            taken = sum(e.memory for e in others) + self.reserved
            short = taken + need - self.capacity if self.capacity else 0
            return None, short, lambda e: e.memory
        room = self._rooms(others)
        placement = place(need, room, allowed, kind=node.accelerator)
        short = 0 if placement is not None else max(1, shortfall(need, room, allowed))
        return placement, short, lambda e: frees_on(_load(e), node, allowed)

    def reserve(self, nbytes: int, entries: Iterable[LoadedModel]) -> list[LoadedModel]:
        """Reserve ``nbytes`` for an RPC worker now (:attr:`reserved` grows before this returns) and return
        the idle models the caller must unload for it (none when it fits beside what is admitted).

        Victims are chosen as for a load (llmman.sched.eviction.choose_victims) among the admitted models
        that are ready and idle; busy ones and models still loading are never chosen. With no capacity
        (0, unknown) every reservation fits.

        Raises:
            LlmmanError: 507 ``insufficient_memory`` when even unloading every idle model leaves too little.
        """
        others = [e for e in entries if e.admitted]
        used = self._used(others)
        short = used + self.reserved + nbytes - self._room_total() if self._room_total() else 0
        victims: list[LoadedModel] = []
        if short > 0:
            idle = {f"{e.plan.reference}#{i}": e for i, e in enumerate(others)
                    if (e.ready and e.refcount == 0) or e.stopping is not None}  # stopping: going anyway
            candidates = [Candidate(key, self._frees(e), pinned=math.isinf(e.keep_alive),
                                    reload_cost=e.plan.size) for key, e in idle.items()]
            if sum(c.size for c in candidates) < short:
                busy = sum(self._frees(e) for e in others) - sum(c.size for c in candidates)
                raise LlmmanError(
                    f"cannot lend {format_bytes(nbytes)}: this node has {format_bytes(self._room_total())} "
                    f"for models, {format_bytes(used)} taken by models ({format_bytes(busy)} of them busy "
                    f"or loading) and {format_bytes(self.reserved)} lent already",
                    status=507, code="insufficient_memory",
                )  # fmt: skip
            victims = [idle[key] for key in choose_victims(candidates, need_bytes=short)]
        self.reserved += nbytes
        return victims

    def unreserve(self, nbytes: int) -> None:
        """Give back ``nbytes`` of :meth:`reserve` (a worker stopped) and wake the admissions waiting."""
        self.reserved = max(0, self.reserved - nbytes)
        self.notify()

    def _room_total(self) -> int:
        """The bytes models and reservations share: the capacity (on a GPU node, the devices' shares)."""
        if self._per_device():
            return sum(r.capacity for r in self._rooms([]))
        return self.capacity

    def _used(self, others: list[LoadedModel]) -> int:
        """What the admitted models take of :meth:`_room_total`."""
        return sum(self._frees(e) for e in others)

    def _frees(self, entry: LoadedModel) -> int:
        """What unloading ``entry`` gives back to the room a reservation is taken from."""
        return 0 if entry.plan.on_host and self._per_device() else entry.memory

    def notify(self) -> None:
        """Wake admissions waiting for a model to drain or go (a release, an unload, a crash)."""
        self._changed.set()
        self._changed = asyncio.Event()


def _load(entry: LoadedModel) -> Load:
    """``entry`` as counted on devices: nothing for a model with no layer on a GPU (``num_gpu`` 0)."""
    return Load(entry.plan.reference, 0 if entry.plan.on_host else entry.memory, entry.plan.placement)
