"""The local half of the data path: a request's model in the store, a lease on its child, the upstream.

The pipeline (api/inference.py) has already asked the router where the request runs; when that is
this node it calls :meth:`Gateway.ensure` (resolve in the store; pull, or copy from the peer the router
named, when missing), then :meth:`Gateway.open`: the scheduler hands out a lease (loading the model if
needed) and the request goes to that model's ``llama-server``. :meth:`Gateway.open` returns once the
child answered with its status line, so the API layer can still send a real HTTP status for failures
before the first byte; after that it streams the body chunks and releases the lease when the stream
ends, fails or the client goes away. See docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from llmman.cluster.copy import PullSource, copy_from_peer
from llmman.cluster.lenders import lease_workers
from llmman.cluster.peers import Peers, local_view
from llmman.cluster.placement import LOCAL, NodeView
from llmman.cluster.source import NODE_ID
from llmman.cluster.split import ALWAYS, NEVER, costs_of, needs_split, on_gpus, plan_split
from llmman.config.presets import Preset, by_reference
from llmman.errors import BadRequest, LlmmanError, ModelNotFound, NotFound, RunnerError
from llmman.protocol.llama_routes import reranks
from llmman.protocol.ollama.fields import RunnerOptions
from llmman.refs import Reference, parse_reference
from llmman.registry.puller import Puller
from llmman.runner.argv import LoadOptions, load_args
from llmman.sched.devices import per_device
from llmman.sched.memory import N_UBATCH, estimate
from llmman.sched.plan import Split, outgrown
from llmman.sched.scheduler import Lease, ModelPlan, Runner, Scheduler
from llmman.store import Store, StoredModel

log = logging.getLogger("llmman.gateway")

HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "server", "date"}
)


@dataclass(frozen=True)
class ResolvedModel:
    """A request's model name resolved against the store."""

    requested: str
    reference: Reference
    stored: StoredModel


def fingerprint(path: str, body: bytes) -> str:
    """A request's identity for the poison-request rules (llmman.sched.healing): its route and bytes."""
    return hashlib.sha256(path.encode() + b"\0" + body).hexdigest()[:32]


async def _exited(runner: Runner, *, within: float) -> bool:
    """True when ``runner`` (a runner.process.LlamaServerProcess) exits within ``within`` seconds."""
    try:
        await asyncio.wait_for(runner.exited.wait(), within)
    except TimeoutError:
        return False
    return True


def _broke(reference: str, exc: Exception) -> RunnerError:
    """The error for a child's answer cut mid-body, in words for the client: what happened, not aiohttp's
    exception text (``Response payload is not completed: <TransferEncodingError …>``), which is logged."""
    log.info("llama-server for %s stopped mid-answer: %r", reference, exc)
    why = "the connection closed before the end" if isinstance(exc, aiohttp.ClientPayloadError) \
        else "the connection failed"
    return RunnerError(f"llama-server for {reference} stopped mid-answer ({why}: it crashed or was killed)")


class UpstreamExchange:
    """An open request to a llama-server child whose status line has arrived.

    Iterate :meth:`chunks` for the body bytes as they come; the lease and the connection are
    released when the iteration ends for any reason, or by :meth:`close`. :meth:`cut` ends it early
    with an error (the daemon's shutdown grace ran out).
    """

    def __init__(self, response: aiohttp.ClientResponse, lease: Lease,
                 on_close: Callable[[UpstreamExchange], None] | None = None) -> None:
        self.status = response.status
        self.headers = {k: v for k, v in response.headers.items() if k.lower() not in HOP_HEADERS}
        self.lease = lease
        self._response = response
        self._closed = False
        self._on_close = on_close

    def cut(self, error: LlmmanError) -> None:
        """End this exchange now: a pending or later read of :meth:`chunks` or :meth:`read` raises
        ``error`` at once (the relay turns it into the dialect's in-band error frame, or a status
        before the first byte); the connection is closed, which cancels the child's work."""
        if not self._closed:
            self._response.content.set_exception(error)

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (no buffering).

        Raises:
            RunnerError: the child closed the connection mid-body (it crashed or was killed).
        """
        try:
            async for chunk in self._response.content.iter_any():
                self.lease.progressed()  # tokens flowing: the child is alive (runner.health)
                yield chunk
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            self.lease.broke()
            raise _broke(self.lease.reference, exc) from exc
        finally:
            self.close()

    async def read(self) -> bytes:
        """The whole body (a non-streamed answer, an error body); closes the exchange.

        Raises:
            RunnerError: the child closed the connection before the end (it crashed or was killed).
        """
        try:
            return await self._response.read()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            self.lease.broke()
            raise _broke(self.lease.reference, exc) from exc
        finally:
            self.close()

    def close(self) -> None:
        """Release the connection and the lease. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._on_close is not None:
                self._on_close(self)
            self._response.release()
            self._response.close()
            self.lease.release()


def _pooling(architecture: str, metadata: Mapping[str, object]) -> str | None:
    """An embedding child's ``--pooling``: ``rank`` for a reranker (llama-server's rerank routes need
    it), ``mean`` for a model whose GGUF names no pooling type (a chat model: llama-server refuses OpenAI
    embeddings with pooling ``none``), else the GGUF's own (None)."""
    if reranks(architecture, metadata):
        return "rank"
    return "mean" if f"{architecture}.pooling_type" not in metadata else None


class Gateway:
    """Resolves models and opens upstream exchanges on their llama-server children.

    Args:
        store: the OCI store models are resolved in.
        scheduler: hands out leases on loaded models.
        session: the one pooled aiohttp client session for every child.
        context_length: default per-slot context in tokens (``server.context_length``).
        aliases: the ``[aliases]`` table for reference parsing.
        num_parallel: default slots per child (``server.num_parallel``).
        presets: ``[models."REF"]`` presets by full reference (config.presets): a model's preset gives its
            default context, slots, keep_alive, ``-ngl``, devices and extra argv.
    """

    def __init__(
        self,
        store: Store,
        scheduler: Scheduler,
        session: aiohttp.ClientSession,
        *,
        context_length: int,
        aliases: dict[str, str],
        num_parallel: int = 1,
        presets: Mapping[str, Preset] | None = None,
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self._session = session
        self._context_length = context_length
        self._aliases = aliases
        self._num_parallel = num_parallel
        # Raises ConfigError for a preset whose name is not a model reference (at daemon start).
        self._presets = by_reference(presets or {}, lambda name: str(parse_reference(name)))
        self.puller: Puller | None = None  # set by the daemon: models missing from the store are pulled
        # Set by the daemon: a model that fits no node is split over the peers that lend RPC workers.
        self.peers: Peers | None = None
        self._splits: dict[str, ModelPlan] = {}  # table key -> the split plan whose child runs or loads
        self._planning: dict[str, asyncio.Lock] = {}  # table key -> one split planned at a time
        self._releasing: set[asyncio.Future[None]] = set()  # releases of workers no child took
        # Set by the daemon: told each lease's model and seconds waited (queue + load), for the metrics.
        self.leased: Callable[[str, float], None] | None = None
        self._open: set[UpstreamExchange] = set()  # exchanges not closed yet (cut_all)
        self._posting: set[asyncio.Future[Any]] = set()  # waits for a lease or status
        self._cut: LlmmanError | None = None

    def cut_all(self, error: LlmmanError) -> int:
        """Cut every answer in progress with ``error``: open exchanges (:meth:`UpstreamExchange.cut`)
        and requests still waiting for the child's status line (:meth:`open` raises ``error``); how
        many there were. The daemon calls it when the shutdown grace runs out, so that every answer
        still running ends with its dialect's error frame (or a 503 before the first byte) instead of
        a torn body or a dropped connection."""
        self._cut = error
        exchanges, posting = list(self._open), list(self._posting)
        for exchange in exchanges:
            exchange.cut(error)
        for future in posting:
            future.cancel()
        return len(exchanges) + len(posting)

    def resolve(self, name: str) -> ResolvedModel:
        """Find ``name`` in the store (the reference rules of :mod:`llmman.refs`).

        Raises:
            ModelNotFound: 404 ``model '<name>' not found``, also for names that do not parse.
        """
        try:
            ref = parse_reference(name, self._aliases)
        except LlmmanError as exc:
            raise ModelNotFound(name) from exc
        stored = self.store.find(ref)
        if stored is None:
            raise ModelNotFound(name)
        return ResolvedModel(requested=name, reference=ref, stored=stored)

    async def ensure(self, name: str, source: PullSource | None = None) -> ResolvedModel:
        """Like :meth:`resolve`, but a model missing from the store is fetched first when a puller is
        set: copied from ``source`` (a peer storing it, as the router decided) if given, else — or when
        that copy fails — pulled from its registry (once, however many requests wait:
        :meth:`Puller.ensure` is single-flight per reference). The same for every route.

        Raises:
            ModelNotFound: 404 ``model '<name>' not found: <why the pull failed>`` (no reason when offline:
                no pull was tried), never a 500.
        """
        try:
            return self.resolve(name)
        except ModelNotFound:
            if self.puller is None:
                raise
        puller = self.puller
        if source is not None:  # aggregation: a peer stores it, copy from its /v2/ first
            try:
                await asyncio.to_thread(copy_from_peer, puller, parse_reference(name, self._aliases), source)
                return self.resolve(name)
            except (LlmmanError, OSError) as exc:
                log.warning("copying %s from peer %s failed: %s", name, source.address.netloc, exc)
        try:
            ref = parse_reference(name, self._aliases)
            await asyncio.to_thread(puller.ensure, ref)
        except LlmmanError as exc:
            # Offline, no pull was tried: the model is simply not here, in Ollama's words.
            raise ModelNotFound(name, None if exc.code == "offline" else exc.message) from exc
        except OSError as exc:
            raise ModelNotFound(name, f"pull failed: {exc.strerror or exc}") from exc
        return self.resolve(name)

    def context_for(self, stored: StoredModel, trained: float | None, num_ctx: int | None = None) -> int:
        """The per-slot context ``stored`` loads with: ``num_ctx`` when given (> 0), else its preset's
        ``context``, else ``server.context_length``; at most ``trained`` (the GGUF's context) and at least
        256. The one rule :meth:`plan`, ``/v1/models`` and ``/api/show`` share."""
        preset = self._presets.get(stored.reference)
        default_ctx = preset.context if preset and preset.context else self._context_length
        n_ctx = num_ctx if num_ctx and num_ctx > 0 else default_ctx
        if trained:
            n_ctx = min(n_ctx, int(trained))
        return max(n_ctx, 256)

    def plan(self, model: ResolvedModel, num_ctx: int | None = None, *, embedding: bool = False,
             options: RunnerOptions | None = None) -> ModelPlan:
        """Build the scheduler's plan for ``model``: files, size and the per-slot context
        (``num_ctx`` or the default, clamped to the GGUF's trained context). ``embedding`` asks for a
        child started with ``--embeddings`` (plus ``--pooling mean`` for a model whose GGUF names no
        pooling type, i.e. a chat model: llama-server refuses OpenAI embeddings with pooling ``none``).

        ``options`` are the request's load options (Ollama's, llmman.protocol.ollama.fields.runner_options;
        its ``num_ctx`` is used when ``num_ctx`` is None): ``num_gpu`` overrides the preset's ``-ngl``,
        the others become flags after the preset's ``extra_args`` (llmman.runner.argv.load_args), and
        ``num_batch`` is the physical batch the memory estimate counts. A plan with other load options
        is another child (ModelPlan.child); asking for it reloads the model (llmman.sched.plan.reloads)."""
        options = options or RunnerOptions()
        if num_ctx is None:
            num_ctx = options.num_ctx
        files = self.store.files(model.stored)
        info = self.store.info(model.stored)
        preset = self._presets.get(model.stored.reference)
        n_parallel = preset.parallel if preset and preset.parallel else self._num_parallel
        n_ctx = self.context_for(model.stored, info.context_length, num_ctx)
        projector = files.mmproj.stat().st_size if files.mmproj and files.mmproj.exists() else 0
        load = LoadOptions(threads=options.num_thread, batch=options.num_batch, main_gpu=options.main_gpu,
                           mmap=options.use_mmap, mlock=options.use_mlock)
        devices = preset.devices if preset else None
        flags = load
        if options.main_gpu is not None:
            devices, main_gpu = self._main_gpu(model, devices, options.main_gpu)
            flags = replace(load, main_gpu=main_gpu)
        # llama.cpp caps the batch at the context it can fill; without num_batch, its default -ub.
        batch = N_UBATCH
        if options.num_batch and not embedding:
            batch = min(options.num_batch, n_ctx * n_parallel)
        predicted = estimate(info, n_ctx=n_ctx, n_parallel=n_parallel, extra_weights=projector,
                             n_ubatch=batch)
        layers = options.num_gpu if options.num_gpu is not None else preset.gpu_layers if preset else None
        return ModelPlan(
            reference=model.stored.reference,
            digest=model.stored.digest,
            size=model.stored.size,
            n_ctx=n_ctx,
            model_path=str(files.model),
            mmproj_path=str(files.mmproj) if files.mmproj else None,
            estimate=predicted.total,
            n_parallel=n_parallel,
            embedding=embedding,
            pooling=_pooling(info.architecture, info.metadata) if embedding else None,
            n_gpu_layers=layers,
            devices=devices,
            extra_args=(preset.extra_args if preset else ()) + load_args(flags, embedding=embedding,
                                                                          n_ctx=n_ctx, cpu_only=layers == 0),
            load=load,
            asked_gpu_layers=options.num_gpu,
        )

    def _main_gpu(self, model: ResolvedModel, pin: str | None, index: int) -> tuple[str | None, int | None]:
        """Ollama's ``main_gpu`` (the GPU that holds the model): the plan's devices and its ``-mg``.

        On a GPU node llmman places models itself (llmman.sched.devices), so the request's GPU pins the
        model to that device: the ``index``-th of the node's devices (of the preset's ``devices`` when it
        pins some), admitted there only, and the child sees that one (no ``-mg``). Elsewhere (host-only,
        unknown devices, a pin that is not a list of indexes) llama-server's own ``-mg index``.

        Raises:
            BadRequest: ``index`` is not one of those devices (400, Ollama's words for options).
        """
        node = self.scheduler.node_memory
        if node is None or not per_device(node):
            return pin, index
        try:
            order = [d.index for d in node.devices] if pin is None else [int(p) for p in pin.split(",")]
        except ValueError:
            return pin, index
        if index >= len(order):
            where = f"its preset's devices ({pin})" if pin is not None else "this node's GPUs"
            raise BadRequest(f'option "main_gpu" is {index}, but {model.requested} may use {len(order)} '
                             f"GPU{'s' if len(order) != 1 else ''} ({where}, counted from 0)")
        return str(order[index]), None

    async def acquire(self, model: ResolvedModel, *, keep_alive: float | None, num_ctx: int | None,
                      embedding: bool = False, request: str | None = None,
                      options: RunnerOptions | None = None) -> Lease:
        """Lease ``model``'s child (its embedding child if ``embedding``), loading it if needed (see
        :meth:`Scheduler.acquire`; ``request`` is the request's :func:`fingerprint`; ``options`` its load
        options, see :meth:`plan`)."""
        # In a thread: the plan may stat or hash the model's files (a changed blob is verified again).
        plan = await asyncio.to_thread(self.plan, model, num_ctx, embedding=embedding, options=options)
        preset = self._presets.get(model.stored.reference)
        if keep_alive is None and preset is not None and preset.keep_alive is not None and not preset.preload:
            # The preset's default for this model; a request's own wins. A preloaded model stays pinned.
            keep_alive = preset.keep_alive
        plan = await self._split(model, plan, preset)
        try:
            lease = await self.scheduler.acquire(plan, keep_alive=keep_alive, request=request)
        except BaseException:
            if plan.split is not None:  # refused, failed, abandoned: its workers go unless a child runs them
                task = asyncio.ensure_future(self._release_unused(plan))
                self._releasing.add(task)
                task.add_done_callback(self._releasing.discard)
            raise
        if self.leased is not None:
            self.leased(lease.reference, lease.load_duration)
        return lease

    def split_of(self, key: str) -> tuple[tuple[str, int], ...]:
        """``(node, bytes)`` of each share of the split child with table ``key`` (this node first, named
        ``local``), or () when the model is not split (``/api/ps``)."""
        plan = self._splits.get(key)
        return plan.split.parts if plan is not None and plan.split is not None else ()

    async def _split(self, model: ResolvedModel, plan: ModelPlan, preset: Preset | None) -> ModelPlan:
        """``plan``, or the split of it when the model is to be split (llmman.cluster.split.needs_split): the
        split already running or loading, else a new one planned over the pool's views
        (llmman.cluster.peers.Peers.current) with its workers leased (llmman.cluster.lenders). A model that
        fits this node's capacity is never split, so the common case asks the peers nothing.

        A loaded split serves a request as the scheduler's loaded child would (a context at least as
        large, the same load options); one the request outgrew (llmman.sched.plan.outgrown) is, when idle,
        unloaded (its workers released) and planned again for this request, with new workers; while busy
        it serves the request at its own context, as a busy unsplit child does. Requests arriving while
        a split is planned (or planned again) wait for that plan."""
        wanted = preset.split if preset is not None else None
        lock = self._planning.setdefault(plan.key, asyncio.Lock())
        live = self._live(plan.key)
        if live is not None and not lock.locked() and not self._replans(live, plan):
            return live
        if self.peers is None or not self.peers or wanted == NEVER:
            return plan
        capacity = self.scheduler.capacity
        if wanted != ALWAYS and (not capacity or plan.estimate <= capacity):
            return plan  # a split it outgrew is unloaded for it by the scheduler (Scheduler.acquire)
        async with lock:
            live = self._live(plan.key)
            if live is not None:
                if not self._replans(live, plan):
                    return live
                await self._retire(live)
            local = local_view(self.scheduler, self.store)
            peers = await self.peers.current(probe=live is not None)  # the freed workers, not old views
            if not needs_split(plan.estimate, [local, *peers], wanted):
                return plan
            try:
                return await self._plan_split(model, plan, local, peers)
            except LlmmanError as exc:
                if exc.status != 503:
                    raise
                # A lender that did not lend (gone since the views, or refusing): plan once more over the
                # peers asked now, which leave out a dead one; the workers lent meanwhile are released.
                log.info("split of %s: %s; planning again over the peers as they answer now", plan.reference,
                         exc.message)
                local = local_view(self.scheduler, self.store)
                peers = await self.peers.current(probe=True)
                if not needs_split(plan.estimate, [local, *peers], wanted):
                    return plan
                return await self._plan_split(model, plan, local, peers)

    def _replans(self, live: ModelPlan, plan: ModelPlan) -> bool:
        """True when the loaded split ``live`` is idle and ``plan`` outgrew it (llmman.sched.plan.outgrown),
        as the scheduler reloads an idle child (Scheduler.acquire); a split loading or busy serves it."""
        if not outgrown(live, plan):
            return False
        for snap in self.scheduler.snapshot():
            if (snap.reference + "#embedding" if snap.embedding else snap.reference) == live.key:
                return snap.ready and snap.refcount == 0 and not snap.draining
        return False

    async def _retire(self, live: ModelPlan) -> None:
        """Unload the split child of ``live`` and wait until it has left the table, its workers released
        (its lenders' reservations freed), so that the new plan counts that memory as room."""
        log.info("%s is asked with a larger context or other load options than its split was planned with: "
                 "planning it again", live.reference)
        await self.scheduler.unload(live.key)
        workers = live.split.workers if live.split is not None else None
        # An idle child is stopped (and its workers deleted) before unload returns; one a request joined
        # meanwhile drains first. The scheduler has no event for its exit here; poll it.
        while self._in_table(live.key) or (workers is not None and not workers.spent):  # noqa: ASYNC110
            await asyncio.sleep(0.25)

    async def _release_unused(self, plan: ModelPlan) -> None:
        """Release ``plan``'s workers once its load has settled without a child running on them: a load
        refused (507) or abandoned while it waited for room never reaches the launcher, which releases them
        itself for every start that fails. Waits (checking twice a second) while another request still
        loads it."""
        workers = plan.split.workers if plan.split is not None else None
        if workers is None:
            return
        await asyncio.sleep(0)  # a cancelled load leaves the table on the next turn of the loop
        # The scheduler's entry has an event for its exit, not for this; a load is seconds, so poll it.
        while not workers.spent and self._in_table(plan.key) and not self.scheduler.is_loaded(plan.key):  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        if not (self.scheduler.is_loaded(plan.key) and self._splits.get(plan.key) is plan):
            await workers.release()

    def _in_table(self, key: str) -> bool:
        """True while the scheduler has an entry (loading, loaded or stopping) with table ``key``."""
        return any((snap.reference + "#embedding" if snap.embedding else snap.reference) == key
                   for snap in self.scheduler.snapshot())

    def _live(self, key: str) -> ModelPlan | None:
        plan = self._splits.get(key)
        if plan is None or plan.split is None or plan.split.workers is None or plan.split.workers.spent:
            return None
        return plan

    async def _plan_split(self, model: ResolvedModel, plan: ModelPlan, local: NodeView,
                          peers: list[NodeView]) -> ModelPlan:
        info = await asyncio.to_thread(self.store.info, model.stored)
        batch = N_UBATCH
        if plan.load.batch and not plan.embedding:
            batch = min(plan.load.batch, plan.n_ctx * plan.n_parallel)
        costs = costs_of(info, n_ctx=plan.n_ctx, n_parallel=plan.n_parallel, n_ubatch=batch)
        # this node's share on its GPUs when it has some (after the workers, llama.cpp's device order)
        gpus = on_gpus(self.scheduler.node_memory, plan.n_gpu_layers)
        split = plan_split(plan.reference, costs, local, peers, gpus=gpus)
        if not split.workers:
            return plan
        assert self.peers is not None
        key = plan.key

        def ended() -> None:
            # The split is over (its child stopped or died): never start it again, nor restart it with
            # these workers; the next request plans afresh (the scheduler's restart finds no failure).
            if self._splits.get(key) is not None and self._splits[key].split is split_fields:
                del self._splits[key]
                self.scheduler.healer.forget(key)

        leases = await lease_workers(self.peers.session, self.peers.headers(), split.workers, owner=NODE_ID,
                                     model=plan.reference, ended=ended)
        split_fields = Split(leases.endpoints, split.n_gpu_layers, split.tensor_split,
                             # /api/ps names each share by its node.name, as llmman nodes does
                             tuple((s.node if s.node == LOCAL else s.label, s.memory) for s in split.shares),
                             workers=leases, local_slots=split.local_slots)
        where = zip(split.workers, leases.endpoints, strict=True)
        log.info("splitting %s: this node %d layer(s) on its %s, %s", plan.reference, split.local.layers,
                 "GPUs" if gpus else "CPU",
                 ", ".join(f"{w.node} {w.layers} layer(s) at {e}" for w, e in where))
        planned = replace(plan, estimate=split.local.memory, split=split_fields)
        self._splits[key] = planned
        return planned

    async def open(
        self,
        model: ResolvedModel,
        path: str,
        body: bytes,
        *,
        keep_alive: float | None = None,
        num_ctx: int | None = None,
        content_type: str = "application/json",
        embedding: bool = False,
        options: RunnerOptions | None = None,
    ) -> UpstreamExchange:
        """POST ``body`` to ``path`` on the model's child and wait for the status line.

        The caller owns the returned exchange and must consume or close it.

        A request is sent at most once: it is tried again (on a fresh child) only when it provably never
        reached the child, i.e. the connection was refused because the child had died a moment before.
        Once sent, a child that dies before its status line is a RunnerError at once, never a replay: a
        request that crashes llama-server would crash the fresh child too, and a poison request is
        refused after two crashes (llmman.sched.healing).

        Raises:
            ModelNotFound, RunnerError: as :meth:`acquire`; RunnerError also when the child refuses
                the connection (it died between the lease and the request) or drops it.
            ServiceUnavailable: this very request crashed the child too often (503, Retry-After).
        """
        request = fingerprint(path, body)
        for attempt in (1, 2):
            lease = await self._cuttable(self.acquire(model, keep_alive=keep_alive, num_ctx=num_ctx,
                                                      embedding=embedding, request=request, options=options))
            posting = asyncio.ensure_future(self._session.post(
                lease.base_url + path,
                data=body,
                headers={"Content-Type": content_type, "Accept-Encoding": "identity"},
                auto_decompress=False,
            ))  # fmt: skip
            self._posting.add(posting)
            try:
                response = await posting
            except asyncio.CancelledError:
                lease.release()
                task = asyncio.current_task()
                if self._cut is not None and posting.cancelled() and not (task and task.cancelling()):
                    raise self._cut from None  # cut_all, not the client: a 503 in the route's dialect
                if posting.done() and not posting.cancelled() and posting.exception() is None:
                    posting.result().close()  # the status line came just as the caller went away
                posting.cancel()
                raise
            except aiohttp.ClientConnectorError as exc:  # no connection: nothing of the request was sent
                lease.release()
                # The child may have died a moment ago (killed, crashed) and not been reaped yet: once
                # its exit is recorded the scheduler forgets it, and a second try loads a new one.
                if attempt == 1 and await _exited(lease.runner, within=3.0):
                    log.info("llama-server for %s had exited; loading it again", lease.reference)
                    continue
                raise RunnerError(f"llama-server for {lease.reference} is not answering: {exc}") from exc
            except aiohttp.ClientConnectionError as exc:  # connected and sent: the child dropped it
                lease.broke()
                lease.release()
                raise RunnerError(f"llama-server for {lease.reference} stopped before answering (it crashed "
                                  f"or was killed: {exc}); the request is not sent again") from exc
            except aiohttp.ClientError as exc:
                lease.release()
                raise RunnerError(f"llama-server for {lease.reference} is not answering: {exc}") from exc
            except BaseException:
                lease.release()
                raise
            finally:
                self._posting.discard(posting)
            exchange = UpstreamExchange(response, lease, self._open.discard)
            self._open.add(exchange)
            return exchange
        raise AssertionError("unreachable")

    async def _cuttable(self, step: Coroutine[object, object, Lease]) -> Lease:
        """Await ``step`` (waiting for a load or a slot) so that :meth:`cut_all` ends it with its error."""
        waiting: asyncio.Future[Lease] = asyncio.ensure_future(step)
        self._posting.add(waiting)
        try:
            return await waiting
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._cut is not None and waiting.cancelled() and not (task and task.cancelling()):
                raise self._cut from None
            if waiting.done() and not waiting.cancelled() and waiting.exception() is None:
                waiting.result().release()  # the lease came just as the caller went away
            waiting.cancel()
            raise
        finally:
            self._posting.discard(waiting)

    async def get_json(self, lease: Lease, path: str) -> object:
        """GET a small JSON document from a leased child (e.g. ``/props``)."""
        async with self._session.get(lease.base_url + path) as response:
            if response.status != 200:
                raise NotFound(f"{path} answered {response.status}")
            return await response.json(content_type=None)
