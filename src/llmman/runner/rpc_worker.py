"""One ``ggml-rpc-server`` process: a worker that holds tensors for a llama-server elsewhere (docs/split.md).

llama.cpp's RPC server (``tools/rpc``) listens on ``-H host -p port``, computes with ``-t`` threads on
its CPU (or ``-d`` devices) and, with ``-c``, keeps the tensors it receives in ``$LLAMA_CACHE/rpc/`` so
a later load of the same weights sends only their hashes. It has no memory limit of its own and no
authentication: the budget is the lending node's reservation (llmman.sched.lending), the network the
operator's (docs/split.md, "Security").

:class:`RpcWorker` owns one such process the way :class:`llmman.runner.process.LlamaServerProcess` owns a
llama-server: spawned in its own process group and killed with the daemon even by SIGKILL
(llmman.runner.orphans, through llmman.runner.child.spawn), its output read continuously into
``<logs_dir>/rpc-<id>.log`` (llmman.runner.logs.ChildLog, rotated like the others), ready once its port
accepts a TCP connection and the process itself listens there (the server prints its endpoint before it
binds, so a line is no proof; another process's server may hold the port), an
``exited`` event set however it ends, and one stop path (SIGTERM, grace, SIGKILL). A connection that is
opened and closed at once is harmless to the server: it logs ``Accepted client connection`` and
``Client connection closed`` and goes on accepting.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import shutil
import signal
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from llmman.errors import RunnerError
from llmman.runner.binary import free_port
from llmman.runner.child import Child, signal_group, spawn, stop_group
from llmman.runner.logfiles import BACKUPS, MAX_BYTES
from llmman.runner.logs import ChildLog

logger = logging.getLogger(__name__)

BIND_FAILED = "Failed to create server socket"  # what ggml-rpc-server prints (exit 0) when its port is taken
CACHE_DIR = "rpc-cache"  # under data_dir: the workers' LLAMA_CACHE (their cache is its rpc/ folder)
_TAIL = 10  # lines quoted in errors
_DRAIN_GRACE = 2.0  # seconds to wait for EOF on the pipes after the process exited
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def rpc_argv(binary: str, *, host: str, port: int, threads: int, cache: bool, stdbuf: str | None = None,
             ) -> list[str]:
    """The worker's command line (pure): ``binary -H host -p port -t threads [-c]``, behind ``stdbuf -oL``
    when ``stdbuf`` is given (the server prints with stdio, block-buffered into a pipe: without it its lines
    reach the log only when it exits normally, never when it is stopped)."""
    argv = [binary, "-H", host, "-p", str(port), "-t", str(max(1, threads))]
    if stdbuf:
        argv[:0] = [stdbuf, "-oL", "-eL"]
    if cache:
        argv.append("-c")
    return argv


def rpc_env(environ: Mapping[str, str], cache_dir: Path) -> dict[str, str]:
    """The worker's environment: ``environ`` with ``LLAMA_CACHE`` set to ``cache_dir`` (its ``-c`` cache is
    ``cache_dir/rpc``, llmman's own instead of ``~/.cache/llama.cpp``)."""
    return {**environ, "LLAMA_CACHE": str(cache_dir)}


def endpoint(host: str, port: int) -> str:
    """``host:port`` as llama-server's ``--rpc`` takes it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class PortTaken(RunnerError):
    """The fixed port given to the worker was taken when it tried to bind it (another process got it
    first): its lender may try another port (llmman.sched.lending, ``rpc.ports``)."""


class RpcWorker:
    """One ``ggml-rpc-server`` on ``host`` (a free port, or ``port``), started once.

    Args:
        binary: the ggml-rpc-server executable (llmman.runner.binary.find_rpc_server).
        host: the address it binds (``-H``).
        threads: its CPU threads (``-t``; the server's own default is 1).
        cache: pass ``-c`` (keep received tensors under ``env["LLAMA_CACHE"]/rpc``).
        env: its complete environment (:func:`rpc_env`).
        log_path: its log file (``<logs_dir>/rpc-<id>.log``).
        port: a fixed port, or None for a free one (one retry on another when it was taken meanwhile).
        start_timeout: seconds for the port to accept before the start fails.
        on_exit: called once, synchronously, when it dies on its own after it was ready (never for
            :meth:`stop`).
        connect_interval: seconds between connection attempts while it starts.
        log_limits: ``(max_bytes, backups)`` of the log file's rotation.
    """

    def __init__(self, binary: str, *, host: str, threads: int, cache: bool, env: Mapping[str, str],
                 log_path: Path, port: int | None = None, start_timeout: float = 30.0,
                 on_exit: Callable[[RpcWorker], None] | None = None, connect_interval: float = 0.02,
                 log_limits: tuple[int, int] = (MAX_BYTES, BACKUPS)) -> None:
        self.binary = binary
        self.host = host
        self._threads = threads
        self._cache = cache
        self._env = dict(env)
        self._fixed_port = port
        self._start_timeout = start_timeout
        self._on_exit = on_exit
        self._interval = connect_interval
        self._log = ChildLog(log_path, ring_lines=200, max_bytes=log_limits[0], backups=log_limits[1])
        self._child: Child | None = None
        self._started = False
        self._stopping = False
        self._stop_task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()  # set once its port accepts
        self.exited = asyncio.Event()  # set once the process is gone (or never came), however it ended

    @property
    def pid(self) -> int | None:
        return self._child.proc.pid if self._child else None

    @property
    def port(self) -> int | None:
        """The port it listens on, or was given (``port``) before it is spawned; None = not chosen yet.
        A fixed port is known at once, so a lender starting several workers never gives one twice."""
        return self._child.port if self._child else self._fixed_port

    @property
    def returncode(self) -> int | None:
        """Exit status once exited (negative = killed by that signal), else None."""
        return self._child.proc.returncode if self._child else None

    @property
    def alive(self) -> bool:
        """Ready and not exited."""
        return self.ready.is_set() and not self.exited.is_set()

    @property
    def frozen(self) -> bool:
        """True when its process exists but is stopped (SIGSTOP, SIGTSTP, a traced stop): it answers
        nothing, and a llama-server using it waits on it for ever. (A cgroup v2 freezer's tasks are not
        shown as stopped and are not detected.)"""
        if self._child is None or self.exited.is_set():
            return False
        try:
            return psutil.Process(self._child.proc.pid).status() in (psutil.STATUS_STOPPED,
                                                                     psutil.STATUS_TRACING_STOP)
        except psutil.Error:
            return False

    @property
    def log_path(self) -> Path:
        return self._log.path

    def log_tail(self, n: int = _TAIL) -> list[str]:
        """Its last ``n`` output lines, oldest first."""
        return self._log.tail(n)

    def endpoint_on(self, host: str) -> str:
        """``host:port`` of this worker as a peer reaches it at ``host``."""
        if self.port is None:
            raise RunnerError("ggml-rpc-server has not been started")
        return endpoint(host, self.port)

    async def start(self) -> None:
        """Spawn it and return once its port accepts a connection.

        Raises:
            RunnerError: it exited while starting (its last lines quoted), could not be run, did not accept
                within ``start_timeout``, was stopped meanwhile, or was started already. No process is left.
            asyncio.CancelledError: the caller went away; the process is killed first.
        """
        if self._started:
            raise RunnerError("this ggml-rpc-server was already started")
        self._started = True
        self._log.open()
        try:
            for attempt in (1, 2):
                port = self._fixed_port if self._fixed_port is not None else self._free_port()
                child = await self._spawn(port)
                if await self._await_ready(child):
                    break
                if self._fixed_port is not None and not self._stopping:
                    raise PortTaken(str(self._exit_error(child)))
                if attempt == 2 or self._stopping:
                    raise self._exit_error(child)
                self._log.note(f"port {port} was taken; retrying on another port")
        except BaseException as exc:
            await asyncio.shield(self._kill())
            self._log.note(f"start failed: {type(exc).__name__}: {exc}")
            self._log.close()
            self.exited.set()
            raise
        self.ready.set()
        self._log.note(f"ready on {endpoint(self.host, port)}")

    def _free_port(self) -> int:
        try:
            return free_port(_WILDCARDS.get(self.host, self.host))
        except OSError as exc:
            raise RunnerError(f"cannot find a free port on {self.host}: {exc}") from exc

    async def _spawn(self, port: int) -> Child:
        if self._stopping:
            raise RunnerError("ggml-rpc-server was stopped before it started")
        argv = rpc_argv(self.binary, host=self.host, port=port, threads=self._threads, cache=self._cache,
                        stdbuf=shutil.which("stdbuf", path=self._env.get("PATH")))
        self._log.note("starting: " + shlex.join(argv))
        try:
            proc = await spawn(argv, self._env)
        except RunnerError as exc:
            raise RunnerError(f"cannot run ggml-rpc-server {self.binary!r}: {exc.__cause__ or exc}") from exc
        child = Child(proc=proc, port=port, first_line=self._log.count)
        assert proc.stdout is not None and proc.stderr is not None
        drains = [asyncio.create_task(self._log.drain(proc.stdout, "stdout", _nothing)),
                  asyncio.create_task(self._log.drain(proc.stderr, "stderr", _nothing))]
        child.tasks = [*drains, asyncio.create_task(self._watch(child, drains))]
        self._child = child
        return child

    async def _await_ready(self, child: Child) -> bool:
        """True once ``child``'s port accepts; False when it exited because the port was taken.

        Raises:
            RunnerError: it exited otherwise, was stopped, or did not accept in time (then it is killed).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._start_timeout
        target = _WILDCARDS.get(self.host, self.host)
        while not child.done.is_set():
            if self._stopping:
                raise RunnerError("ggml-rpc-server was stopped while starting")
            if await _accepts(target, child.port, within=min(1.0, max(0.05, deadline - loop.time()))) \
                    and _listens(child.proc.pid, child.port):  # not another process's server on the port
                return True
            if loop.time() >= deadline:
                raise RunnerError(f"ggml-rpc-server did not accept connections on "
                                  f"{endpoint(self.host, child.port)} within {self._start_timeout:g} s; "
                                  "last lines: " + "\n".join(self._own_tail(child)))
            try:
                await asyncio.wait_for(child.done.wait(), self._interval)
            except TimeoutError:
                pass
        if self._stopping:
            raise RunnerError("ggml-rpc-server was stopped while starting")
        if any(BIND_FAILED in line for line in self._own_tail(child)):
            return False
        raise self._exit_error(child)

    def _own_tail(self, child: Child) -> list[str]:
        return self._log.tail(min(self._log.count - child.first_line, _TAIL))

    def _exit_error(self, child: Child) -> RunnerError:
        return RunnerError(f"ggml-rpc-server exited with code {child.proc.returncode} while starting on "
                           f"{endpoint(self.host, child.port)}: " + "\n".join(self._own_tail(child)))

    async def _watch(self, child: Child, drains: list[asyncio.Task[None]]) -> None:
        """Await the exit; one while ready (not stopped) is reported through ``on_exit``."""
        code = await child.proc.wait()
        signal_group(child, signal.SIGKILL)  # anything left in its process group
        _, pending = await asyncio.wait(drains, timeout=_DRAIN_GRACE)
        for task in pending:
            task.cancel()
        child.done.set()
        if child is not self._child or not self.ready.is_set() or self._stopping:
            return  # start() or stop() reports this one
        logger.warning("ggml-rpc-server %s (pid %d) exited with code %d; last lines:\n%s",
                       endpoint(self.host, child.port), child.proc.pid, code,
                       "\n".join(self._log.tail(_TAIL)))
        self._log.note(f"exited with code {code}")
        self._log.close()
        self.exited.set()
        if self._on_exit is not None:
            try:
                self._on_exit(self)
            except Exception:
                logger.exception("on_exit callback of ggml-rpc-server %s failed", self._log.path.name)

    async def _kill(self) -> None:
        child = self._child
        if child is not None:
            signal_group(child, signal.SIGKILL)
            await child.done.wait()

    async def stop(self, grace: float = 5.0) -> None:
        """Stop it: SIGTERM to its process group, up to ``grace`` seconds, then SIGKILL; reap it.

        Idempotent, safe concurrently and during :meth:`start` (which then fails); ``on_exit`` is not called.
        """
        if self._stop_task is None:
            self._stop_task = asyncio.create_task(self._stop(grace))
        await asyncio.shield(self._stop_task)

    async def _stop(self, grace: float) -> None:
        self._stopping = True
        child = self._child
        try:
            if child is not None:
                await stop_group(child, grace, self._log.note)
        finally:
            self._log.close()
            if self.ready.is_set() or child is None:
                self.exited.set()  # else start() sets it once it has given up


async def _accepts(host: str, port: int, *, within: float) -> bool:
    """True when a TCP connection to ``host:port`` opens within ``within`` seconds (it is closed at once)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), within)
    except (OSError, TimeoutError):
        return False
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return True


def _listens(pid: int, port: int) -> bool:
    """True when process ``pid`` itself listens on TCP ``port``. A port that accepts may be another
    process's: two lenders on one host with the same ``rpc.ports`` both find it free, one binds it, and the
    other's worker, which failed to, must not pass as ready on it (its peer would share another's worker)."""
    try:
        proc = psutil.Process(pid)
        conns = proc.net_connections("tcp") if hasattr(proc, "net_connections") else proc.connections("tcp")
    except psutil.AccessDenied:  # a platform that will not say: the port accepting is all there is
        return True
    except psutil.Error:  # it is gone
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


def _nothing() -> None:
    """No stall timer to feed: a worker is silent between clients."""
