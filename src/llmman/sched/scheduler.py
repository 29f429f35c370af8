"""Which models are loaded, who is using them, and when they go.

The scheduler owns the table of loaded models. A request asks for a model with
:meth:`Scheduler.acquire` and gets a :class:`Lease` (the model's llama-server base URL); while any
lease is held the model is never unloaded. When the last lease is released the model's
``keep_alive`` timer starts (Ollama's rule): 0 unloads at once, a negative value (``math.inf`` here)
keeps it forever, anything else expires after that many seconds.

Loading is single-flight per model (one ``llama-server`` start however many requests wait for it)
and never blocks other models: each model has its own load task, the table itself is only touched
between awaits.

A request whose load options (Ollama's ``num_gpu``, ``num_thread``, ``num_batch``, ``main_gpu``,
``use_mmap``, ``use_mlock``) differ from the loaded child's reloads the model, as Ollama does
(:func:`llmman.sched.plan.reloads`): the loaded child drains (its requests finish), then the model loads
with the new options; a request that gives none is served by the loaded child.

One child per GGUF file and child options (:attr:`ModelPlan.child`), as Ollama keys its runners by
model path: a copy or second tag of a loaded model is served by the loaded child, whose table entry
keeps the name that loaded it (``/api/ps`` shows that one entry, as Ollama does); unloading either
name unloads the child.

Memory-aware admission is :class:`llmman.sched.admission.Admission`'s: a model loads once it
fits beside the others, idle ones being unloaded and busy ones drained to make room. Requests
that would wait (for a load, or for a slot beyond ``n_parallel``) are bounded by ``max_queue``:
past it, Ollama's 503 ``server busy`` with ``Retry-After``.

Self-healing (rules in :mod:`llmman.sched.healing`, state in :mod:`llmman.sched.failures`): a failed
load or a crash is recorded with its classified cause; a cooling-down model answers 503 with
``Retry-After``; a pinned or busy model that crashes is restarted after a backoff until the breaker
opens; an out-of-memory load is retried once with half the context.

Draining (docs/aggregation.md, "Draining a node and stopping a model"):

* a stop (:meth:`Scheduler.unload`, ``llmman stop``) of a busy model marks it draining: the requests on it
  finish, nobody new joins it (a new request waits until its child has exited, then loads it afresh), so
  a stop takes effect under steady traffic;
* :meth:`Scheduler.drain` drains the node: every model unloads as soon as it is idle, whatever its
  keep_alive (idle ones at once), and no crashed model is restarted; what still reaches the node is
  served (the router sends new work elsewhere). :meth:`Scheduler.undrain` ends it;
* a load whose last waiter went away (the client left, or a front node gave up on this peer) is
  cancelled and its child killed, unless nobody asked for it (a restart) or it is pinned (keep_alive
  forever: a preload) and already started: those load for themselves. One still waiting for room is
  cancelled whatever its keep_alive, and the busy models its admission asked to drain stay
  (llmman.sched.admission.Admission.admit).

An entry whose child is stopping stays in the table (draining) until the child has exited: its memory is
still counted by admission and a new load of the same model waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace

from llmman.errors import LlmmanError, RunnerError, ServerBusy
from llmman.sched import healing
from llmman.sched.admission import Admission
from llmman.sched.failures import Healer
from llmman.sched.gpu import NodeMemory
from llmman.sched.memory import parse_buffers
from llmman.sched.plan import MAX_KEEP_ALIVE, ChildKey, Launcher, ModelPlan, Runner, reloads
from llmman.sched.table import Lease, LoadedModel, LoadedSnapshot, snapshot_of
from llmman.sizes import format_bytes

log = logging.getLogger("llmman.sched.scheduler")


class Scheduler:
    """The table of loaded models, with single-flight loads, leases and keep-alive timers.

    Args:
        launcher: starts a child for a plan (see :data:`Launcher`).
        default_keep_alive: seconds (``math.inf`` = forever), from ``server.keep_alive``.
        stop_grace: seconds between SIGTERM and SIGKILL when stopping a child.
        clock: wall clock in unix seconds (injected for tests).
        capacity: bytes models may take on this node (llmman.sched.gpu.NodeMemory.capacity); 0 = no limit.
        node_memory: the node's devices, for per-device admission (llmman.sched.devices); None = none.
        max_loaded: most models loaded at once; 0 = no limit but memory.
        max_queue: most requests waiting (for a load or a slot) before 503; 0 = no limit.
        heal_base: seconds of the first cool-down / restart delay (llmman.sched.healing.BASE_S).
    """

    def __init__(
        self,
        launcher: Launcher,
        *,
        default_keep_alive: float,
        stop_grace: float = 10.0,
        clock: Callable[[], float] = time.time,
        capacity: int = 0,
        node_memory: NodeMemory | None = None,
        max_loaded: int = 0,
        max_queue: int = 0,
        heal_base: float = healing.BASE_S,
    ) -> None:
        self._launch = launcher
        self._default_keep_alive = math.inf if default_keep_alive > MAX_KEEP_ALIVE else default_keep_alive
        self._stop_grace = stop_grace
        self._clock = clock
        self._table: dict[str, LoadedModel] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._closed = False
        self._admission = Admission(capacity=capacity, max_loaded=max_loaded, node_memory=node_memory)
        self._max_queue = max_queue
        self.healer = Healer(base=heal_base)
        self.draining = False  # the node is draining (llmman drain): see drain(); read by /llmman/node
        self.lends = False  # reservations may be asked (rpc.serve, set by llmman.sched.lending.Lending)
        self.reservations = 0  # reservations held now (one per lent worker); read by /llmman/node

    @property
    def capacity(self) -> int:
        """Bytes models may take on this node; 0 = no limit."""
        return self._admission.capacity

    @property
    def node_memory(self) -> NodeMemory | None:
        """The node's devices admission places models on (``/llmman/node``'s ``devices``), or None."""
        return self._admission.node

    @property
    def reserved(self) -> int:
        """Bytes lent to RPC workers of peers (llmman.sched.lending), counted by admission."""
        return self._admission.reserved

    async def reserve(self, nbytes: int) -> None:
        """Reserve ``nbytes`` of this node's memory for an RPC worker: at once, or after unloading idle
        models to make room (llmman.sched.admission.Admission.reserve; busy ones are never touched).
        Returns once the unloaded models' children have exited. Give it back with :meth:`unreserve`.

        Raises:
            LlmmanError: 507 ``insufficient_memory`` (not enough even without the idle models); 503 when
                the daemon shuts down.
        """
        if self._closed:
            raise LlmmanError("llmman is shutting down", status=503, code="shutting_down")
        victims = self._admission.reserve(nbytes, self._table.values())
        self.reservations += 1
        for victim in victims:
            log.info("unloading %s to make room for %s lent to an RPC worker", victim.plan.reference,
                     format_bytes(nbytes))
        stops = [self._spawn_stop(victim) for victim in victims]  # all at once: none can turn busy between
        try:
            await asyncio.shield(asyncio.gather(*stops))
        except BaseException:
            self.unreserve(nbytes)
            raise

    def unreserve(self, nbytes: int) -> None:
        """Give back ``nbytes`` of :meth:`reserve` (the worker stopped); waiting admissions are woken."""
        self.reservations = max(0, self.reservations - 1)
        self._admission.unreserve(nbytes)

    def _is_closed(self) -> bool:
        return self._closed

    # -- requests ---------------------------------------------------------------------------

    async def acquire(self, plan: ModelPlan, *, keep_alive: float | None = None,
                      request: str | None = None) -> Lease:
        """Return a lease on ``plan``'s model, loading it first if needed.

        Args:
            plan: the resolved model; ``plan.reference`` keys the table.
            keep_alive: seconds from the request (None = keep the model's current value, or the
                daemon default for a new load); overwrites the loaded model's value as Ollama does.
            request: the request's fingerprint (llmman.gateway.fingerprint), suspected when the child
                crashes while it is in flight; a poison one is refused (llmman.sched.healing).

        Raises:
            RunnerError: the child failed to start (its last log lines are in the message).
            LlmmanError: the daemon is shutting down (503).
            ServiceUnavailable: ``request`` crashed the model's child too often (503, Retry-After).
        """
        started = time.monotonic()
        while True:
            if self._closed:
                raise LlmmanError("llmman is shutting down", status=503, code="shutting_down")
            self.healer.check_request(plan.key, request, plan.reference)
            entry = self._lookup(plan.key, plan.child)
            if (entry is not None and entry.ready and max(entry.plan.n_ctx, entry.oom_ctx) < plan.n_ctx
                    and entry.refcount == 0 and not entry.leaving):
                # A bigger context was asked for (than the one loaded, or the one that did not fit)
                # and nobody is using the model: reload it.
                await self._unload_entry(entry)
                continue
            if entry is not None and not entry.leaving and reloads(entry.plan, plan):
                # Other load options (num_thread, num_gpu, ...): as Ollama, the loaded child goes once
                # its requests end (at once when idle) and this request then loads the model afresh.
                log.info("%s is asked with other load options: reloading it", plan.reference)
                if entry.ready and entry.refcount == 0:
                    await self._unload_entry(entry)
                else:
                    entry.unload_when_idle = True
                continue
            queued = (entry is None or not entry.ready or entry.refcount >= entry.plan.n_parallel
                      or entry.leaving)
            if queued and self._max_queue and self.queued() >= self._max_queue:
                raise ServerBusy()
            if entry is not None and entry.leaving:
                await self._wait_gone(entry)  # a stopped model: its requests finish, then it loads afresh
                continue
            if entry is None:
                self.healer.check(plan.key, plan.reference)
                entry = LoadedModel(plan=plan, keep_alive=self._default_keep_alive)
                self._table[plan.key] = entry
            elif entry.plan.key != plan.key:
                entry.sharers.add(plan.key)
            if keep_alive is not None:
                entry.keep_alive = math.inf if keep_alive > MAX_KEEP_ALIVE else keep_alive
            entry.refcount += 1
            self._cancel_timer(entry)
            try:
                runner = await self._wait_ready(entry)
            except BaseException:
                entry.refcount -= 1
                if entry.ready:  # cancelled after the load finished: nobody else may start its timer
                    self._idle(entry)
                elif self._table.get(entry.plan.key) is entry and entry.refcount == 0:
                    self._abandoned(entry)
                raise
            if self._table.get(entry.plan.key) is not entry:
                # The model died or was unloaded between ready and now: start over.
                entry.refcount -= 1
                continue
            return Lease(self._release, entry, runner, time.monotonic() - started, request)

    async def _wait_gone(self, entry: LoadedModel) -> None:
        """Wait, counted as queued, until ``entry`` (draining or stopping) has left the table."""
        entry.held_back += 1
        try:
            await entry.gone.wait()
        finally:
            entry.held_back -= 1

    def _abandoned(self, entry: LoadedModel) -> None:
        """The last waiter of ``entry``'s load went away: cancel the load (which kills the child) unless
        nobody asked for it (a restart) or it is pinned (keep_alive forever, as a preload) and already
        started. A load still waiting for room (admission) is cancelled even when pinned: nothing is
        loaded, nor evicted, for a client that has gone (Ollama skips a cancelled pending request)."""
        load = entry.load_task
        if load is None or load.done():
            self._drop(entry)
        elif not entry.restarted and (not math.isinf(entry.keep_alive) or not entry.admitted):
            log.info("nobody waits for %s any more: its load is cancelled", entry.plan.reference)
            entry.unload_when_idle = True  # a request arriving meanwhile waits for it to go, then loads
            load.cancel()

    def _lookup(self, key: str, child: ChildKey | None = None) -> LoadedModel | None:
        """The entry for table key ``key``: its own, else one already serving it, else (with ``child``,
        ModelPlan.child) one that runs the same file with the same options."""
        entry = self._table.get(key)
        if entry is not None:
            return entry
        for other in self._table.values():
            if key in other.sharers or (child is not None and other.plan.child == child):
                return other
        return None

    async def _wait_ready(self, entry: LoadedModel) -> Runner:
        if entry.runner is not None:
            return entry.runner
        if entry.load_task is None:
            entry.load_task = asyncio.create_task(self._load(entry), name=f"load {entry.plan.reference}")
            entry.load_task.add_done_callback(_retrieve)
        return await asyncio.shield(entry.load_task)

    async def _load(self, entry: LoadedModel) -> Runner:
        try:
            await self._admission.admit(entry, self._table.values, self._unload_entry, self._is_closed)
            log.info("loading %s (n_ctx %d, estimate %s)", entry.plan.reference, entry.plan.n_ctx,
                     format_bytes(entry.plan.estimate))
            runner = await self._launch_once_more_on_oom(entry)
        except BaseException as exc:
            self._drop(entry)
            if isinstance(exc, RunnerError) and not self._closed:
                failure = self.healer.failed_load(entry.plan.key, cause=exc.cause, message=exc.message)
                if healing.should_restart(failure, pinned=math.isinf(entry.keep_alive), busy=False):
                    # A pinned model (preset preload, keep_alive < 0) is loaded again by itself after
                    # its cool-down, until the breaker opens.
                    self._restart_later(entry.plan, entry.keep_alive, self.healer.delay(failure))
            raise
        self.healer.loaded(entry.plan.key)
        usage = parse_buffers(runner.log_lines)
        if usage is not None:
            entry.usage_host, entry.usage_device = usage.host, usage.device
            log.info("%s uses %s (estimated %s)", entry.plan.reference, format_bytes(usage.total),
                     format_bytes(entry.plan.estimate))
        entry.runner = runner
        entry.started_at = self._clock()
        if self._closed or self._table.get(entry.plan.key) is not entry:
            await runner.stop(self._stop_grace)
            raise LlmmanError("llmman is shutting down", status=503, code="shutting_down")
        log.info("%s ready at %s", entry.plan.reference, runner.base_url)
        if entry.refcount == 0:  # every waiter went away while it loaded: start its keep_alive now
            self._idle(entry)
        return runner

    async def _launch_once_more_on_oom(self, entry: LoadedModel) -> Runner:
        """Launch ``entry``; a load that ran out of memory is retried once with half the context."""
        try:
            return await self._launch(entry.plan, lambda r: self._on_exit(entry, r))
        except RunnerError as exc:
            smaller = healing.smaller_context(entry.plan.n_ctx)
            if exc.cause != "out of memory" or smaller is None or self._closed:
                raise
            log.warning("%s ran out of memory with n_ctx %d; retrying once with n_ctx %d",
                        entry.plan.reference, entry.plan.n_ctx, smaller)
            entry.oom_ctx = entry.plan.n_ctx  # asking for it again reuses this load, not another OOM
            entry.plan = replace(entry.plan, n_ctx=smaller)
            return await self._launch(entry.plan, lambda r: self._on_exit(entry, r))

    def queued(self) -> int:
        """Requests waiting: for a load, for a slot of a model whose slots are all busy, or for a draining
        model to go (to load it afresh)."""
        return sum(max(0, e.refcount - e.plan.n_parallel * e.ready) + e.held_back
                   for e in self._table.values())

    def _release(self, entry: LoadedModel) -> None:
        entry.refcount -= 1
        self._idle(entry)
        self._admission.notify()

    def _idle(self, entry: LoadedModel) -> None:
        """Start ``entry``'s keep_alive (or unload it) if nobody holds it now."""
        if entry.refcount > 0 or self._table.get(entry.plan.key) is not entry:
            return
        self._cancel_timer(entry)
        if self.draining or entry.unload_when_idle or entry.evicting or entry.keep_alive <= 0:
            self._spawn_stop(entry)
            return
        if math.isinf(entry.keep_alive):
            entry.expires_at = None
            return
        entry.expires_at = self._clock() + entry.keep_alive
        loop = asyncio.get_running_loop()
        entry.timer = loop.call_later(entry.keep_alive, self._expire, entry)

    def _expire(self, entry: LoadedModel) -> None:
        entry.timer = None
        if entry.refcount == 0 and self._table.get(entry.plan.key) is entry and entry.stopping is None:
            log.info("%s idle past its keep_alive, unloading", entry.plan.reference)
            self._spawn_stop(entry)

    def _on_exit(self, entry: LoadedModel, runner: Runner) -> None:
        """Called by the child when it dies on its own: forget it at once, record the failure, and
        restart a pinned or busy model after its backoff (llmman.sched.healing)."""
        if self._table.get(entry.plan.key) is not entry or entry.stopping is not None:
            return
        self._drop(entry)
        if self._closed:
            return
        classified = runner.exit_cause.value if runner.exit_cause is not None else "unknown"
        cause = runner.exit_detail or classified  # the fuller one where known: "hung (no /health answer ...)"
        failure = self.healer.crashed(entry.plan.key, cause=cause, message="\n".join(runner.log_tail(5)),
                                      uptime=self._clock() - entry.started_at)
        self.healer.suspected(entry.plan.key, entry.suspects(), cause=cause)
        pinned, busy = math.isinf(entry.keep_alive), entry.refcount > 0
        if healing.should_restart(failure, pinned=pinned, busy=busy):
            self._restart_later(entry.plan, entry.keep_alive, self.healer.delay(failure))

    def _restart_later(self, plan: ModelPlan, keep_alive: float, delay: float) -> None:
        log.warning("restarting %s in %.1f s", plan.reference, delay)
        self.healer.later(delay, lambda: self._restart(plan, keep_alive), name=f"restart {plan.reference}")

    async def _restart(self, plan: ModelPlan, keep_alive: float) -> None:
        """Load ``plan`` again after a crash or a pinned model's failed load (nobody holds it); a
        failed load of a pinned model schedules the next try itself (:meth:`_load`). Nothing happens when
        the model was unloaded on purpose meanwhile (:meth:`unload` forgets its failures), nor on a
        draining node."""
        if self._closed or self.draining or plan.key in self._table or plan.key not in self.healer.failures:
            return
        entry = LoadedModel(plan=plan, keep_alive=keep_alive, restarted=True)
        self._table[plan.key] = entry
        with contextlib.suppress(Exception):
            await self._wait_ready(entry)

    # -- unloading ---------------------------------------------------------------------------

    async def unload(self, reference: str) -> bool:
        """Unload a model as Ollama's ``keep_alive: 0`` does: at once when idle, else when the last
        in-flight request finishes (it drains: a new request waits for it to go, then loads it afresh). A
        load in progress is waited for first, then unloaded. Its
        embedding child (ModelPlan.embedding), if any, goes too, and so does a child it shares with a
        copy of the model (ModelPlan.child).

        Returns:
            True if the model was loaded (or loading), False if it was not in the table.
        """
        self.healer.forget(reference)  # unloading on purpose also resets a failing model's breaker
        self.healer.forget(reference + "#embedding")
        embedding = await self._unload_key(reference + "#embedding")
        return await self._unload_key(reference) or embedding

    async def _unload_key(self, key: str) -> bool:
        entry = self._lookup(key)
        if entry is None:
            return False
        entry.unload_when_idle = True  # from now on nobody joins it
        if entry.load_task is not None and not entry.load_task.done():
            await asyncio.wait((entry.load_task,))  # however it ends (failed, cancelled: abandoned)
        if self._table.get(entry.plan.key) is not entry:
            return True
        if entry.refcount == 0:
            await self._unload_entry(entry)
        return True  # else the last release stops it (_idle)

    async def _unload_entry(self, entry: LoadedModel) -> None:
        """Stop ``entry``'s child and wait until it has exited and left the table."""
        await asyncio.shield(self._spawn_stop(entry))

    def _spawn_stop(self, entry: LoadedModel) -> asyncio.Task[None]:
        """Start stopping ``entry``'s child, once (a second call returns the same task). The entry stays
        in the table, draining, until the child has exited."""
        if entry.stopping is None:
            self._cancel_timer(entry)
            task = asyncio.create_task(self._stop_child(entry), name=f"unload {entry.plan.reference}")
            entry.stopping = task
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        return entry.stopping

    async def _stop_child(self, entry: LoadedModel) -> None:
        try:
            if entry.runner is not None:
                log.info("unloading %s", entry.plan.key)
                await entry.runner.stop(self._stop_grace)
        finally:
            self._drop(entry)

    def _drop(self, entry: LoadedModel) -> None:
        """Forget ``entry``: out of the table, the requests held back by it woken, admissions told."""
        self._cancel_timer(entry)
        if self._table.get(entry.plan.key) is entry:
            del self._table[entry.plan.key]
        entry.gone.set()
        self._admission.notify()

    # -- draining the node ---------------------------------------------------------------------

    def drain(self) -> None:
        """Drain this node (``llmman drain``): unload every idle model now and every busy one when its
        last request ends, whatever its keep_alive; restart nothing. Requests that still arrive are served
        (and their model unloads when idle). Idempotent."""
        if not self.draining:
            log.info("draining: every model unloads once idle")
        self.draining = True
        for entry in list(self._table.values()):
            if entry.ready and entry.refcount == 0:
                self._spawn_stop(entry)

    def undrain(self) -> None:
        """End :meth:`drain`: models loaded from now on keep their keep_alive again. Idempotent."""
        if self.draining:
            log.info("serving again")
        self.draining = False

    def _cancel_timer(self, entry: LoadedModel) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        entry.expires_at = None

    # -- views and shutdown -------------------------------------------------------------------

    def snapshot(self) -> list[LoadedSnapshot]:
        """The loaded (and loading) models, for ``/api/ps`` (llmman.sched.table.snapshot_of)."""
        now = self._clock()
        return [snapshot_of(entry, now) for entry in self._table.values()]

    def is_loaded(self, reference: str) -> bool:
        """True when ``reference`` has a ready child (its own, or one it shares)."""
        entry = self._lookup(reference)
        return entry is not None and entry.ready

    async def close(self) -> None:
        """Stop every child (SIGTERM, grace, SIGKILL) and refuse new work. Idempotent."""
        self._closed = True
        self._admission.notify()
        await self.healer.close()
        entries = list(self._table.values())
        self._table.clear()
        for entry in entries:
            self._cancel_timer(entry)
            entry.gone.set()
        loads = [e.load_task for e in entries if e.load_task is not None and not e.load_task.done()]
        for task in loads:
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)
        stops = [e.runner.stop(self._stop_grace) for e in entries if e.runner is not None]
        await asyncio.gather(*stops, *self._stopping, return_exceptions=True)


def _retrieve(task: asyncio.Task[Runner]) -> None:
    """Mark a load's outcome as seen, so a load nobody waits for any more logs no asyncio warning."""
    if not task.cancelled():
        task.exception()


__all__ = ["MAX_KEEP_ALIVE", "Launcher", "Lease", "LoadedModel", "LoadedSnapshot", "ModelPlan", "Runner",
           "RunnerError", "Scheduler"]
