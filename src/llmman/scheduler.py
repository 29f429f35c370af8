"""Which models are loaded, who is using them, and when they go.

The scheduler owns the table of loaded models. A request asks for a model with
:meth:`Scheduler.acquire` and gets a :class:`Lease` (the model's llama-server base URL); while any
lease is held the model is never unloaded. When the last lease is released the model's
``keep_alive`` timer starts (Ollama's rule, reference/ollama.md §1.7): 0 unloads at once, a
negative value (``math.inf`` here) keeps it forever, anything else expires after that many seconds.

Loading is single-flight per model (one ``llama-server`` start however many requests wait for it)
and never blocks other models: each model has its own load task, the table itself is only touched
between awaits.

Memory-aware admission (:meth:`Scheduler._admit`): a model is admitted when its memory (the GGUF
estimate, ``plan.estimate`` bytes) fits the node's capacity beside the admitted models (each counted
at what llama-server reported after its load, else its estimate) and ``max_loaded`` allows one more.
Otherwise :func:`llmman.eviction.choose_victims` picks models to unload: idle ones go at once, busy
ones are marked and unloaded when their last request ends (never cut). One admission at a time.
A model larger than the whole capacity fails at once, naming both figures. Requests that would
wait (for a load, or for a slot beyond ``n_parallel``) are bounded by ``max_queue``: past it,
Ollama's 503 ``server busy`` with ``Retry-After``.

Self-healing (rules in :mod:`llmman.healing`, state in :mod:`llmman.scheduler_healing`): a failed
load or a crash is recorded with its classified cause; a cooling-down model answers 503 with
``Retry-After``; a pinned or busy model that crashes is restarted after a backoff until the breaker
opens; an out-of-memory load is retried once with half the context.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from llmman import healing
from llmman.errors import LlmmanError, RunnerError, ServerBusy
from llmman.eviction import Candidate, choose_victims
from llmman.memory import parse_buffers
from llmman.scheduler_healing import Healer
from llmman.sizes import format_bytes

log = logging.getLogger("llmman.scheduler")

MAX_KEEP_ALIVE = 292 * 365.25 * 86400.0
"""Seconds; a longer keep_alive means forever (Go's largest duration, where Ollama's ends too)."""


class Runner(Protocol):
    """What the scheduler needs of a started llama-server child (runner.process.LlamaServerProcess)."""

    @property
    def base_url(self) -> str: ...

    @property
    def pid(self) -> int | None: ...

    async def stop(self, grace: float = 10.0) -> None: ...


@dataclass(frozen=True)
class ModelPlan:
    """Everything needed to start one model, resolved from the store by the caller.

    Attributes:
        reference: canonical full reference, e.g. ``docker.io/ai/smollm2:135m`` (the table key).
        digest: manifest digest ``sha256:<hex>``.
        size: bytes of weights (sum of the manifest's layers).
        n_ctx: context per slot in tokens, already clamped to the model's trained context.
        model_path: the file for llama-server's ``-m`` (first shard of a split GGUF).
        mmproj_path: the multimodal projector for ``--mmproj``, or None.
        details: Ollama ``details`` object for listings (family, parameter_size, quantization_level).
        estimate: predicted memory in bytes (llmman.memory.estimate), 0 = unknown (admitted freely).
        n_parallel: slots (``-np``); requests beyond them wait inside llama-server and count as queued.
        embedding: start the child with ``--embeddings`` (its own child, beside a chat child of the model).
        pooling: ``--pooling`` for an embedding child (``mean`` for chat models whose GGUF has none), or None.
        n_gpu_layers: ``-ngl`` from the model's preset (llmman.presets), or None.
        devices: GPU ids for the child's ``*_VISIBLE_DEVICES`` from its preset, or None.
        extra_args: the preset's ``extra_args``, appended to argv.
    """

    reference: str
    digest: str
    size: int
    n_ctx: int
    model_path: str = ""
    mmproj_path: str | None = None
    details: dict[str, object] = field(default_factory=dict)
    estimate: int = 0
    n_parallel: int = 1
    embedding: bool = False
    pooling: str | None = None
    n_gpu_layers: int | None = None
    devices: str | None = None
    extra_args: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The scheduler's table key: the reference, plus ``#embedding`` for an embedding child."""
        return self.reference + "#embedding" if self.embedding else self.reference


Launcher = Callable[[ModelPlan, Callable[[Runner], None]], Awaitable[Runner]]
"""Starts a child for a plan and returns it once ready; the second argument is the on-exit
callback the child must call if it dies on its own. Raises RunnerError on failure."""


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
    unload_when_idle: bool = False
    admitted: bool = False  # counted against the node's memory
    evicting: bool = False  # chosen to make room: unload when idle, whatever keep_alive says
    usage_host: int = 0  # bytes llama-server reported after loading (0 = not reported)
    usage_device: int = 0

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
    details: dict[str, object]
    started_at: float
    expires_at: float | None
    refcount: int
    ready: bool
    pid: int | None
    memory: int = 0
    memory_device: int = 0


class Lease:
    """A hold on a loaded model. Release it exactly once (``async with`` does it).

    Attributes:
        base_url: the child's ``http://127.0.0.1:PORT``.
        reference: the canonical reference of the model.
        load_duration: seconds spent waiting for the model (queue + load), for Ollama's
            ``load_duration``.
    """

    def __init__(
        self, scheduler: Scheduler, entry: LoadedModel, runner: Runner, load_duration: float
    ) -> None:
        self._scheduler = scheduler
        self._entry = entry
        self.base_url = runner.base_url
        self.reference = entry.plan.reference
        self.load_duration = load_duration
        self.runner = runner
        self._released = False

    def release(self) -> None:
        """Drop the hold; starts the keep-alive timer when it was the last one. Idempotent."""
        if not self._released:
            self._released = True
            self._scheduler._release(self._entry)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class Scheduler:
    """The table of loaded models, with single-flight loads, leases and keep-alive timers.

    Args:
        launcher: starts a child for a plan (see :data:`Launcher`).
        default_keep_alive: seconds (``math.inf`` = forever), from ``server.keep_alive``.
        stop_grace: seconds between SIGTERM and SIGKILL when stopping a child.
        clock: wall clock in unix seconds (injected for tests).
        capacity: bytes models may take on this node (llmman.gpu.NodeMemory.capacity); 0 = no limit.
        max_loaded: most models loaded at once; 0 = no limit but memory.
        max_queue: most requests waiting (for a load or a slot) before 503; 0 = no limit.
        heal_base: seconds of the first cool-down / restart delay (llmman.healing.BASE_S).
    """

    def __init__(
        self,
        launcher: Launcher,
        *,
        default_keep_alive: float,
        stop_grace: float = 10.0,
        clock: Callable[[], float] = time.time,
        capacity: int = 0,
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
        self.capacity = capacity
        self._max_loaded = max_loaded
        self._max_queue = max_queue
        self._admit_lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self.healer = Healer(base=heal_base)

    # -- requests ---------------------------------------------------------------------------

    async def acquire(self, plan: ModelPlan, *, keep_alive: float | None = None) -> Lease:
        """Return a lease on ``plan``'s model, loading it first if needed.

        Args:
            plan: the resolved model; ``plan.reference`` keys the table.
            keep_alive: seconds from the request (None = keep the model's current value, or the
                daemon default for a new load); overwrites the loaded model's value as Ollama does.

        Raises:
            RunnerError: the child failed to start (its last log lines are in the message).
            LlmmanError: the daemon is shutting down (503).
        """
        started = time.monotonic()
        while True:
            if self._closed:
                raise LlmmanError("llmman is shutting down", status=503, code="shutting_down")
            entry = self._table.get(plan.key)
            if entry is not None and entry.ready and entry.plan.n_ctx < plan.n_ctx and entry.refcount == 0:
                # A bigger context was asked for and nobody is using the model: reload it.
                await self._unload_entry(entry)
                continue
            queued = entry is None or not entry.ready or entry.refcount >= entry.plan.n_parallel
            if queued and self._max_queue and self.queued() >= self._max_queue:
                raise ServerBusy()
            if entry is None:
                self.healer.check(plan.key, plan.reference)
                entry = LoadedModel(plan=plan, keep_alive=self._default_keep_alive)
                self._table[plan.key] = entry
            if keep_alive is not None:
                entry.keep_alive = math.inf if keep_alive > MAX_KEEP_ALIVE else keep_alive
            entry.refcount += 1
            self._cancel_timer(entry)
            entry.unload_when_idle = False
            try:
                runner = await self._wait_ready(entry)
            except BaseException:
                entry.refcount -= 1
                if entry.ready:  # cancelled after the load finished: nobody else may start its timer
                    self._idle(entry)
                elif self._table.get(plan.key) is entry and entry.refcount == 0:
                    if entry.load_task is None or entry.load_task.done():
                        self._table.pop(plan.key, None)
                raise
            if self._table.get(plan.key) is not entry:
                # The model died or was unloaded between ready and now: start over.
                entry.refcount -= 1
                continue
            return Lease(self, entry, runner, time.monotonic() - started)

    async def _wait_ready(self, entry: LoadedModel) -> Runner:
        if entry.runner is not None:
            return entry.runner
        if entry.load_task is None:
            entry.load_task = asyncio.create_task(self._load(entry), name=f"load {entry.plan.reference}")
            entry.load_task.add_done_callback(_retrieve)
        return await asyncio.shield(entry.load_task)

    async def _load(self, entry: LoadedModel) -> Runner:
        try:
            await self._admit(entry)
            log.info("loading %s (n_ctx %d, estimate %s)", entry.plan.reference, entry.plan.n_ctx,
                     format_bytes(entry.plan.estimate))
            runner = await self._launch_once_more_on_oom(entry)
        except BaseException as exc:
            if self._table.get(entry.plan.key) is entry:
                self._table.pop(entry.plan.key, None)
            if isinstance(exc, RunnerError) and not self._closed:
                self.healer.failed_load(entry.plan.key, cause=exc.cause, message=exc.message)
            self._notify()
            raise
        self.healer.loaded(entry.plan.key)
        lines = getattr(runner, "log_lines", None)
        usage = parse_buffers(lines) if isinstance(lines, list) else None
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
            entry.plan = replace(entry.plan, n_ctx=smaller)
            return await self._launch(entry.plan, lambda r: self._on_exit(entry, r))

    async def _admit(self, entry: LoadedModel) -> None:
        """Make room for ``entry`` (see the module docstring); returns once it is admitted.

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
        async with self._admit_lock:
            while True:
                if self._closed:
                    raise LlmmanError("llmman is shutting down", status=503, code="shutting_down")
                others = [e for e in self._table.values() if e is not entry and e.admitted]
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
                        await self._unload_entry(victim)
                        unloaded = True
                    elif not victim.evicting:
                        log.info("%s waits for %s to finish its requests", entry.plan.reference,
                                 victim.plan.reference)
                        victim.evicting = True
                if not unloaded:
                    await changed.wait()

    def _notify(self) -> None:
        """Wake admissions waiting for a model to drain or go."""
        self._changed.set()
        self._changed = asyncio.Event()

    def queued(self) -> int:
        """Requests waiting: for a load, or for a slot of a model whose slots are all busy."""
        return sum(max(0, e.refcount - e.plan.n_parallel * e.ready) for e in self._table.values())

    def _release(self, entry: LoadedModel) -> None:
        entry.refcount -= 1
        self._idle(entry)
        self._notify()

    def _idle(self, entry: LoadedModel) -> None:
        """Start ``entry``'s keep_alive (or unload it) if nobody holds it now."""
        if entry.refcount > 0 or self._table.get(entry.plan.key) is not entry:
            return
        self._cancel_timer(entry)
        if entry.unload_when_idle or entry.evicting or entry.keep_alive <= 0:
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
        if entry.refcount == 0 and self._table.get(entry.plan.key) is entry:
            log.info("%s idle past its keep_alive, unloading", entry.plan.reference)
            self._spawn_stop(entry)

    def _on_exit(self, entry: LoadedModel, runner: Runner) -> None:
        """Called by the child when it dies on its own: forget it at once, record the failure, and
        restart a pinned or busy model after its backoff (llmman.healing)."""
        if self._table.get(entry.plan.key) is not entry:
            return
        self._table.pop(entry.plan.key, None)
        self._cancel_timer(entry)
        self._notify()
        if self._closed:
            return
        detail = getattr(runner, "exit_detail", None)  # e.g. "hung (no /health answer for 31 s)"
        cause = str(detail or getattr(getattr(runner, "exit_cause", None), "value", "unknown"))
        tail = getattr(runner, "log_tail", None)
        message = "\n".join(tail(5)) if callable(tail) else "exited"
        failure = self.healer.crashed(entry.plan.key, cause=cause,
                                      message=message, uptime=self._clock() - entry.started_at)
        pinned, busy = math.isinf(entry.keep_alive), entry.refcount > 0
        if healing.should_restart(failure, pinned=pinned, busy=busy):
            delay = self.healer.delay(failure)
            log.warning("restarting %s in %.1f s", entry.plan.reference, delay)
            self.healer.later(delay, lambda: self._restart(entry.plan, entry.keep_alive),
                              name=f"restart {entry.plan.reference}")

    async def _restart(self, plan: ModelPlan, keep_alive: float) -> None:
        """Load ``plan`` again after a crash (nobody holds it); a failed load restarts again while a
        pinned model's breaker is shut."""
        if self._closed or plan.key in self._table:
            return
        entry = LoadedModel(plan=plan, keep_alive=keep_alive)
        self._table[plan.key] = entry
        try:
            await self._wait_ready(entry)
        except Exception:
            failure = self.healer.failures.get(plan.key)
            if failure is not None and not self._closed and healing.should_restart(
                    failure, pinned=math.isinf(keep_alive), busy=False):
                self.healer.later(self.healer.delay(failure), lambda: self._restart(plan, keep_alive),
                                  name=f"restart {plan.reference}")

    # -- unloading ---------------------------------------------------------------------------

    async def unload(self, reference: str) -> bool:
        """Unload a model as Ollama's ``keep_alive: 0`` does: at once when idle, else when the last
        in-flight request finishes. A load in progress is waited for first, then unloaded. Its
        embedding child (ModelPlan.embedding), if any, goes too.

        Returns:
            True if the model was loaded (or loading), False if it was not in the table.
        """
        self.healer.forget(reference)  # unloading on purpose also resets a failing model's breaker
        self.healer.forget(reference + "#embedding")
        embedding = await self._unload_key(reference + "#embedding")
        return await self._unload_key(reference) or embedding

    async def _unload_key(self, reference: str) -> bool:
        entry = self._table.get(reference)
        if entry is None:
            return False
        if entry.load_task is not None and not entry.load_task.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(entry.load_task)
        if self._table.get(reference) is not entry:
            return True
        if entry.refcount > 0:
            entry.unload_when_idle = True
            return True
        await self._unload_entry(entry)
        return True

    async def _unload_entry(self, entry: LoadedModel) -> None:
        self._cancel_timer(entry)
        if self._table.get(entry.plan.key) is entry:
            self._table.pop(entry.plan.key, None)
        try:
            if entry.runner is not None:
                log.info("unloading %s", entry.plan.key)
                await entry.runner.stop(self._stop_grace)
        finally:
            self._notify()

    def _spawn_stop(self, entry: LoadedModel) -> None:
        task = asyncio.create_task(self._unload_entry(entry), name=f"unload {entry.plan.reference}")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _cancel_timer(self, entry: LoadedModel) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        entry.expires_at = None

    # -- views and shutdown -------------------------------------------------------------------

    def snapshot(self) -> list[LoadedSnapshot]:
        """The loaded (and loading) models, for ``/api/ps``. A busy or loading model shows
        ``expires_at`` = now + keep_alive, as Ollama does."""
        now = self._clock()
        out: list[LoadedSnapshot] = []
        for entry in self._table.values():
            expires: float | None
            if math.isinf(entry.keep_alive):
                expires = None
            elif entry.expires_at is not None:
                expires = entry.expires_at
            else:
                expires = now + max(entry.keep_alive, 0.0)
            out.append(
                LoadedSnapshot(
                    reference=entry.plan.reference,
                    digest=entry.plan.digest,
                    size=entry.plan.size,
                    n_ctx=entry.plan.n_ctx,
                    details=entry.plan.details,
                    started_at=entry.started_at or now,
                    expires_at=expires,
                    refcount=entry.refcount,
                    ready=entry.ready,
                    pid=entry.runner.pid if entry.runner is not None else None,
                    memory=entry.memory,
                    memory_device=entry.usage_device,
                )
            )
        return out

    def is_loaded(self, reference: str) -> bool:
        """True when ``reference`` has a ready child."""
        entry = self._table.get(reference)
        return entry is not None and entry.ready

    async def close(self) -> None:
        """Stop every child (SIGTERM, grace, SIGKILL) and refuse new work. Idempotent."""
        self._closed = True
        self._notify()
        await self.healer.close()
        entries = list(self._table.values())
        self._table.clear()
        for entry in entries:
            self._cancel_timer(entry)
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


__all__ = ["Launcher", "Lease", "LoadedSnapshot", "ModelPlan", "Runner", "RunnerError", "Scheduler"]
