"""The workers this node lends to peers: ``ggml-rpc-server`` processes, their leases and their memory.

A peer that splits a model too large for any one node (docs/split.md) asks this node for a worker with
``POST /llmman/rpc/workers`` (llmman.api.rpc_routes). :meth:`Lending.lend` then

1. refuses when ``rpc.serve`` is off (403 ``rpc_disabled``) or no ``ggml-rpc-server`` comes with the
   llama-server in use (503, llmman.runner.binary.find_rpc_server);
2. reserves the worker's memory in the scheduler's admission (llmman.sched.scheduler.Scheduler.reserve:
   idle models are unloaded to make room as for a load, busy ones never; 507 when it cannot), so nothing
   else is admitted into it;
3. starts the worker (llmman.runner.rpc_worker.RpcWorker) on ``rpc.bind`` (else the host of
   ``server.host``) and a free port, and answers once the port accepts. Its log is
   ``<logs_dir>/rpc-<id>.log``; those of the :data:`LOGS_KEPT` workers that ended last are kept.

Each worker holds a lease of ``rpc.lease`` seconds that its owner renews (:meth:`Lending.renew`, every
third of it); one not renewed in time is stopped and its memory given back. So is a worker stopped by
its owner (:meth:`Lending.stop`, ``DELETE``), and every worker when the daemon stops (:meth:`Lending.close`;
one the daemon cannot stop, after a SIGKILL, dies with it: llmman.runner.orphans). A worker that exits by
itself is forgotten at once: its memory is free and its id answers 404 ``worker_gone`` from then on, which
its owner takes as the end of its split.

A lent worker is not a model: it is in no scheduler table and ``/api/ps`` does not list it;
``/llmman/node`` shows it in its ``rpc`` part (llmman.cluster.state.node_document, from the scheduler's
``lends``, ``reserved`` and ``reservations``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmman.errors import LlmmanError, NotFound
from llmman.runner.binary import port_free
from llmman.runner.logfiles import BACKUPS, MAX_BYTES
from llmman.runner.rpc_worker import PortTaken, RpcWorker, rpc_env
from llmman.sched.scheduler import Scheduler
from llmman.sizes import format_bytes

log = logging.getLogger("llmman.sched.lending")

WILDCARDS = frozenset({"", "0.0.0.0", "::"})  # bind hosts a peer cannot connect to as such
_MAPPED = "::ffff:"  # an IPv4 address as a dual-stack socket reports it


def addresses(bind: str, reach: str) -> tuple[str, str]:
    """Where a worker listens (``-H``) and the host its endpoint names, for the bind address ``bind``
    (``rpc.bind``, else the host of ``server.host``) and the address ``reach`` a peer's request came to.

    A wildcard (``0.0.0.0``, ``::``, empty) listens on every IPv4 address and names ``reach`` (an
    IPv4-mapped one unwrapped), else loopback. ``ggml-rpc-server`` listens on IPv4 only (it accepts an IPv6
    ``-H`` and then never binds it), so an IPv6 address is refused here rather than after a timeout.

    Raises:
        LlmmanError: 503 ``rpc_ipv6`` for an IPv6 bind address, or a wildcard reached over IPv6.
    """
    if bind in WILDCARDS:
        host = reach.removeprefix(_MAPPED) if reach.startswith(_MAPPED) else (reach or "127.0.0.1")
        if ":" in host:
            raise LlmmanError(f"this node was reached over IPv6 ({host}) and ggml-rpc-server listens on "
                              "IPv4 only: set rpc.bind (LLMMAN_RPC_BIND) to this node's IPv4 address",
                              status=503, code="rpc_ipv6")
        return "0.0.0.0", host
    if ":" in bind:
        raise LlmmanError(f"rpc.bind {bind!r} is an IPv6 address and ggml-rpc-server listens on IPv4 only: "
                          "set rpc.bind (LLMMAN_RPC_BIND) to an IPv4 address of this node",
                          status=503, code="rpc_ipv6")
    return bind, bind
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL for a worker
MAX_WORKERS = 32  # workers lent at once, those still starting included (503 rpc_workers_exhausted past it)
LOGS_KEPT = 16  # logs of workers no longer running kept (rpc-<id>.log and its rotations), newest first


def prune_logs(logs_dir: Path, live: set[str], keep: int = LOGS_KEPT) -> None:
    """Delete the ``rpc-<id>.log`` files (and their rotated ``.N`` files) of workers not in ``live`` beyond
    the ``keep`` newest: each worker has its own id, so without this every split would leave a file."""
    try:
        files = [p for p in logs_dir.glob("rpc-*.log*") if p.is_file()]
        ids: dict[str, float] = {}
        for p in files:
            worker_id = p.name.removeprefix("rpc-").split(".log", 1)[0]
            if worker_id not in live:
                ids[worker_id] = max(ids.get(worker_id, 0.0), p.stat().st_mtime)
        old = set(sorted(ids, key=lambda i: ids[i], reverse=True)[keep:])
        for p in files:
            if p.name.removeprefix("rpc-").split(".log", 1)[0] in old:
                p.unlink(missing_ok=True)
    except OSError as exc:  # a log directory that cannot be read or cleaned never stops a lend
        log.debug("cannot prune the RPC workers' logs in %s: %s", logs_dir, exc)


class WorkerGone(NotFound):
    """The worker died, expired or was stopped (HTTP 404 ``worker_gone``)."""

    code = "worker_gone"

    def __init__(self, worker_id: str) -> None:
        super().__init__(f"no RPC worker {worker_id!r} here: it exited, expired or was stopped")


class RpcDisabled(LlmmanError):
    """This node does not lend workers (``rpc.serve`` is off): HTTP 403 ``rpc_disabled``."""

    status = 403
    code = "rpc_disabled"

    def __init__(self) -> None:
        super().__init__("this node does not lend RPC workers: rpc.serve (LLMMAN_RPC_SERVE) is off")


@dataclass(eq=False)
class LentWorker:
    """One worker lent to ``owner`` (a peer's node id) for ``model``, holding ``memory`` bytes reserved."""

    id: str
    owner: str
    model: str
    memory: int
    worker: RpcWorker
    endpoint: str = ""  # host:port as the owner reaches it
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


@dataclass(frozen=True)
class LendingOptions:
    """What :class:`Lending` needs of the settings (``rpc.*``), the paths and the environment.

    Attributes:
        serve: ``rpc.serve``.
        lease: ``rpc.lease`` seconds.
        bind: the address workers listen on (``rpc.bind``, else the host of ``server.host``).
        cache: ``rpc.cache`` (the workers' ``-c``).
        cache_dir: their ``LLAMA_CACHE`` (``<data_dir>/rpc-cache``).
        logs_dir: where ``rpc-<id>.log`` goes.
        threads: each worker's ``-t``.
        log_limits: ``(log.file_size, log.file_count)``.
        ports: ``rpc.ports`` as ``(first, last)``: each worker takes the first of them that is free; None =
            a free port the OS picks.
    """

    serve: bool
    lease: float
    bind: str
    cache: bool
    cache_dir: Path
    logs_dir: Path
    threads: int
    log_limits: tuple[int, int] = (MAX_BYTES, BACKUPS)
    ports: tuple[int, int] | None = None


class Lending:
    """The table of lent workers (see the module docstring).

    Args:
        scheduler: whose admission holds the reservations.
        options: the settings' part (:class:`LendingOptions`).
        find_binary: the ggml-rpc-server to run, or RunnerError (503) when there is none.
        environ: the workers' base environment (the daemon's, scrubbed of systemd's variables).
    """

    def __init__(self, scheduler: Scheduler, options: LendingOptions, *, find_binary: Callable[[], str],
                 environ: Mapping[str, str]) -> None:
        self._scheduler = scheduler
        scheduler.lends = options.serve  # /llmman/node's rpc.serve (llmman.cluster.state.node_document)
        self.options = options
        self._find_binary = find_binary
        self._env = rpc_env(environ, options.cache_dir)
        self._workers: dict[str, LentWorker] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._closed = False
        self._starting = 0  # lends making their reservation, not yet in the table (MAX_WORKERS)

    @property
    def serve(self) -> bool:
        """True when this node lends workers (``rpc.serve``)."""
        return self.options.serve

    def get(self, worker_id: str) -> LentWorker | None:
        """The worker lent as ``worker_id``, None when there is none (any more)."""
        return self._workers.get(worker_id)

    def listing(self) -> list[dict[str, Any]]:
        """The workers lent now, for ``GET /llmman/rpc/workers``."""
        loop = asyncio.get_running_loop()
        return [{"id": w.id, "owner": w.owner, "model": w.model, "memory": w.memory, "endpoint": w.endpoint,
                 "alive": w.worker.alive,
                 "expires_in": round(max(0.0, w.timer.when() - loop.time()), 3) if w.timer else 0.0}
                for w in self._workers.values()]

    async def lend(self, owner: str, model: str, memory: int, *, reach: str = "") -> LentWorker:
        """Start a worker for ``owner`` holding ``memory`` bytes; returns once it accepts connections.

        Args:
            reach: the address the request came to on this node (its connection's local address): the
                endpoint's host when workers bind a wildcard (``0.0.0.0``, ``::``).

        Raises:
            RpcDisabled: ``rpc.serve`` is off (403).
            LlmmanError: 503 ``draining`` while the node drains (llmman.sched.scheduler.Scheduler.drain);
                503 ``rpc_workers_exhausted`` with :data:`MAX_WORKERS` lent or starting already.
            RunnerError: no ggml-rpc-server (503), or it would not start (500, its last lines quoted).
            LlmmanError: 507 ``insufficient_memory`` (llmman.sched.scheduler.Scheduler.reserve); 503 when
                the daemon shuts down.
        """
        if not self.serve:
            raise RpcDisabled()
        self._check_open()
        if self._scheduler.draining:  # a node being emptied takes on nothing new (llmman drain)
            raise LlmmanError("this node is draining: it lends no new RPC workers", status=503,
                              code="draining")
        listen, advertised = addresses(self.options.bind, reach)
        binary = self._find_binary()
        if len(self._workers) + self._starting >= MAX_WORKERS:
            raise LlmmanError(f"this node lends at most {MAX_WORKERS} RPC workers at once and lends "
                              f"{len(self._workers) + self._starting} now", status=503,
                              code="rpc_workers_exhausted")
        prune_logs(self.options.logs_dir, set(self._workers))
        self._starting += 1  # counted while its reservation is made, then in the table (no await between)
        try:
            await self._scheduler.reserve(memory)
        finally:
            self._starting -= 1
        worker_id = secrets.token_hex(8)
        taken: set[int] = set()  # ports of rpc.ports another process bound first
        while True:
            try:
                port = self._port(listen, taken)
            except LlmmanError:
                self._scheduler.unreserve(memory)
                raise
            worker = RpcWorker(binary, host=listen, threads=self.options.threads, port=port,
                               cache=self.options.cache, env=self._env,
                               log_path=self.options.logs_dir / f"rpc-{worker_id}.log",
                               on_exit=lambda w: self._exited(worker_id), log_limits=self.options.log_limits)
            lent = LentWorker(worker_id, owner, model, memory, worker)
            self._workers[worker_id] = lent  # from now on close() stops it too
            try:
                self._check_open()
                await worker.start()
                self._check_open()
                break
            except PortTaken:
                if self._workers.pop(worker_id, None) is not lent:
                    raise  # close() ended it meanwhile (and gave its memory back)
                assert port is not None  # only a fixed port can be taken
                taken.add(port)  # the reservation stays: the next port of rpc.ports
            except BaseException:
                if self._workers.pop(worker_id, None) is lent:
                    await asyncio.shield(self._end(lent))
                raise
        lent.endpoint = worker.endpoint_on(advertised)
        self._arm(lent)
        log.info("lent an RPC worker at %s (%s, pid %s) to %s for %s", lent.endpoint, format_bytes(memory),
                 worker.pid, owner or "a peer", model or "a model")
        return lent

    def _port(self, host: str, taken: set[int] | None = None) -> int | None:
        """The port for a new worker: None (a free one) without ``rpc.ports``, else the first port of the
        range that no worker of ours holds, is not in ``taken`` and binds on ``host`` now.

        Raises:
            LlmmanError: 503 ``rpc_ports_exhausted``: every port of ``rpc.ports`` is taken.
        """
        if self.options.ports is None:
            return None
        first, last = self.options.ports
        ours = {w.worker.port for w in self._workers.values()}
        for port in range(first, last + 1):
            if port not in ours and port not in (taken or ()) and port_free(host, port):
                return port
        raise LlmmanError(f"every port of rpc.ports ({first}-{last}) is taken: this node lends no more RPC "
                          f"workers now", status=503, code="rpc_ports_exhausted")

    def renew(self, worker_id: str) -> float:
        """Extend ``worker_id``'s lease by ``rpc.lease`` seconds from now; returns the lease.

        Raises:
            WorkerGone: no such worker (it exited, expired or was stopped): 404; also for one whose process
                is stopped (SIGSTOP), which is then stopped for good and its memory given back.
        """
        lent = self._workers.get(worker_id)
        if lent is None or not lent.worker.alive:
            raise WorkerGone(worker_id)
        if lent.worker.frozen:  # its owner's llama-server would wait on it for ever: the split must end
            log.warning("the RPC worker at %s lent to %s is stopped (SIGSTOP): stopping it",
                        lent.endpoint, lent.owner or "a peer")
            del self._workers[worker_id]
            self._background(self._end(lent))
            raise WorkerGone(worker_id)
        self._arm(lent)
        return self.options.lease

    async def stop(self, worker_id: str) -> bool:
        """Stop ``worker_id`` and give back its memory (``DELETE``); False when it was gone already."""
        lent = self._workers.pop(worker_id, None)
        if lent is None:
            return False
        log.info("stopping the RPC worker at %s lent to %s", lent.endpoint, lent.owner or "a peer")
        await asyncio.shield(self._end(lent))
        return True

    async def close(self) -> None:
        """Stop every worker and refuse new ones (the daemon stops). Idempotent."""
        self._closed = True
        lent, self._workers = list(self._workers.values()), {}
        await asyncio.gather(*(self._end(w) for w in lent), *self._stopping, return_exceptions=True)

    def _check_open(self) -> None:
        if self._closed:
            raise LlmmanError("llmman is shutting down", status=503, code="shutting_down")

    def _arm(self, lent: LentWorker) -> None:
        """(Re)start ``lent``'s lease timer."""
        if lent.timer is not None:
            lent.timer.cancel()
        lent.timer = asyncio.get_running_loop().call_later(self.options.lease, self._expire, lent.id)

    def _expire(self, worker_id: str) -> None:
        """A lease ran out: the worker is stopped, its memory given back once it has exited."""
        lent = self._workers.pop(worker_id, None)
        if lent is None:
            return
        log.warning("the RPC worker at %s lent to %s was not renewed within %g s: stopping it",
                    lent.endpoint, lent.owner or "a peer", self.options.lease)
        self._background(self._end(lent))

    def _exited(self, worker_id: str) -> None:
        """A worker died by itself: forgotten now (renew answers 404), its memory given back."""
        lent = self._workers.pop(worker_id, None)
        if lent is None:
            return
        log.warning("the RPC worker at %s lent to %s exited by itself (code %s)", lent.endpoint,
                    lent.owner or "a peer", lent.worker.returncode)
        if lent.timer is not None:
            lent.timer.cancel()
        self._scheduler.unreserve(lent.memory)

    async def _end(self, lent: LentWorker) -> None:
        """Stop ``lent``'s process (whatever state it is in) and give back its memory once it has exited."""
        if lent.timer is not None:
            lent.timer.cancel()
        exited_alone = lent.worker.exited.is_set() and lent.worker.ready.is_set()
        try:
            await lent.worker.stop(STOP_GRACE)
        finally:
            if not exited_alone:  # _exited gave it back already
                self._scheduler.unreserve(lent.memory)

    def _background(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(work)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

