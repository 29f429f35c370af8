"""Admission of models into the node's memory: who must go (or drain) before a model may load.

:class:`Admission` decides, one admission at a time, whether a model fits: its memory (the GGUF
estimate, ``plan.estimate`` bytes) beside the admitted models (each counted at what llama-server reported
after its load, else its estimate) within ``capacity``, and one more model within ``max_loaded``.
Otherwise :func:`llmman.eviction.choose_victims` picks models to unload: idle ones go at once, busy ones
are marked ``evicting`` and unloaded by the scheduler when their last request ends (never cut), and the
admission waits for :meth:`Admission.notify`. A model larger than the whole capacity fails at once,
naming both figures.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterable

from llmman.errors import LlmmanError
from llmman.sched.eviction import Candidate, choose_victims
from llmman.sched.table import LoadedModel
from llmman.sizes import format_bytes

log = logging.getLogger("llmman.sched.scheduler")


class Admission:
    """The memory and count limits of one node, and the admissions waiting on them.

    Args:
        capacity: bytes models may take on this node (llmman.sched.gpu.NodeMemory.capacity); 0 = no limit.
        max_loaded: most models loaded at once; 0 = no limit but memory.
    """

    def __init__(self, *, capacity: int = 0, max_loaded: int = 0) -> None:
        self.capacity = capacity
        self._max_loaded = max_loaded
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
            LlmmanError: 500 ``insufficient_memory`` when the model is larger than the whole capacity;
                503 when the daemon shuts down meanwhile.
        """
        need = entry.plan.estimate
        if self.capacity and need > self.capacity:
            raise LlmmanError(
                f"model {entry.plan.reference} needs {format_bytes(need)} of memory, but this node has "
                f"{format_bytes(self.capacity)} for models (resources.memory minus resources.reserve)",
                status=500, code="insufficient_memory",
            )  # fmt: skip
        async with self._lock:
            while True:
                if closed():
                    raise LlmmanError("llmman is shutting down", status=503, code="shutting_down")
                others = [e for e in entries() if e is not entry and e.admitted]
                short = sum(e.memory for e in others) + need - self.capacity if self.capacity else 0
                excess = len(others) + 1 - self._max_loaded if self._max_loaded else 0
                if short <= 0 and excess <= 0:
                    entry.admitted = True
                    return
                keys = {f"{e.plan.reference}#{i}": e for i, e in enumerate(others)}
                candidates = [
                    Candidate(key, e.memory, busy=e.refcount > 0 or not e.ready,
                              pinned=math.isinf(e.keep_alive), reload_cost=e.plan.size)
                    for key, e in keys.items()
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
                if not unloaded:
                    await changed.wait()

    def notify(self) -> None:
        """Wake admissions waiting for a model to drain or go (a release, an unload, a crash)."""
        self._changed.set()
        self._changed = asyncio.Event()
