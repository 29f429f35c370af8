"""One llama-server child: the single owner of its process state (llama-swap's ``process`` package).

Everything that changes the child's state happens here: :meth:`LlamaServerProcess.start` is the one
start path, a watcher task notices the exit at once, :meth:`LlamaServerProcess.stop` is the one stop
path. Callers never check the state and then act; they call ``start()`` and get READY or an error.
Process behaviour relied on is that of llama-server b11434 (llama.cpp ``tools/server``): it
binds HTTP first and answers ``/health`` 503 while loading, 200 when ready; a failed load exits 1;
SIGTERM during loading kills it at once, after loading it is a graceful stop.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import shlex
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from llmman.errors import LoadTimeout, RunnerError
from llmman.runner.argv import LaunchSpec, build_argv
from llmman.runner.binary import free_port
from llmman.runner.child import (
    BindFailed,
    Child,
    load_exit_error,
    poll_health,
    signal_group,
    spawn,
    stop_group,
    url,
)
from llmman.runner.crash import Cause, classify
from llmman.runner.health import WatchdogPolicy, watch
from llmman.runner.logfiles import BACKUPS, MAX_BYTES
from llmman.runner.logs import ChildLog

logger = logging.getLogger(__name__)

_EXIT_TAIL_LINES = 10  # lines of child output quoted in errors and exit logs
_DRAIN_GRACE = 2.0  # seconds to wait for EOF on the pipes after the child exited


class RunnerState(enum.Enum):
    """Life of one child. STOPPED is also the state before ``start()``."""

    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


class LlamaServerProcess:
    """One llama-server child serving ``spec`` on ``host:port``.

    Args:
        binary: the llama-server executable (see ``find_llama_server``).
        spec: what to load; turned into argv by ``build_argv``.
        env: the child's complete environment (see ``child_env``).
        log_path: per-model log file; child output is appended to it.
        stall_timeout: seconds of silence (no output at all) after which a load is abandoned.
        host: address the child binds and llmman polls.
        port: a fixed port, or None to pick a free one (then one retry if it was taken meanwhile).
        ring_lines: how many recent output lines to keep in memory.
        on_exit: called once, synchronously, when the child dies while READY (never for ``stop()``).
        poll_interval: seconds between ``GET /health`` polls while loading; 25 ms puts on average
            ~12 ms between ready and noticed (a cold start's overhead, bench/bench_cold.py) for a
            few dozen loopback requests a second to a child that answers 503 at once.
        health_interval: seconds between ``GET /health`` probes while READY (runner.health); 0 = no
            watchdog. After ``health_failures`` unanswered probes in a row, and no progress for as long
            (output on its pipes, or bytes relayed from it: :meth:`progressed`), the child counts as
            hung: its process group is SIGKILLed and it dies like a crash (``on_exit``, ``exit_cause``
            HUNG, ``exit_detail`` ``hung (no /health answer for X s, no progress for Y s)``).
        health_failures: consecutive unanswered probes that mean hung.
        log_limits: ``(max_bytes, backups)`` of the log file's rotation (runner.logs.ChildLog;
            ``log.file_size``, ``log.file_count``).

    One instance runs one child once: to restart, make a new instance.
    """

    def __init__(
        self,
        binary: str,
        spec: LaunchSpec,
        *,
        env: Mapping[str, str],
        log_path: Path,
        stall_timeout: float,
        host: str = "127.0.0.1",
        port: int | None = None,
        ring_lines: int = 100,
        on_exit: Callable[[LlamaServerProcess], None] | None = None,
        poll_interval: float = 0.025,
        health_interval: float = 0.0,
        health_failures: int = 3,
        log_limits: tuple[int, int] = (MAX_BYTES, BACKUPS),
    ) -> None:
        self.binary = binary
        self.spec = spec
        self._env = dict(env)
        self._host = host
        self._fixed_port = port
        self._stall_timeout = stall_timeout
        self._on_exit = on_exit
        self._poll_interval = poll_interval
        self._watchdog = WatchdogPolicy(health_interval, health_failures)
        self._health_task: asyncio.Task[None] | None = None
        self._hung_reason: str | None = None
        self._log = ChildLog(log_path, ring_lines=ring_lines, max_bytes=log_limits[0], backups=log_limits[1])
        self._state = RunnerState.STOPPED
        self._child: Child | None = None
        self._start_called = False
        self._stop_requested = False
        self._stop_task: asyncio.Task[None] | None = None
        self._spawn_lock = asyncio.Lock()
        self._last_output = 0.0  # loop.time() of the latest output chunk
        self._last_progress = 0.0  # loop.time() of the latest output chunk or relayed byte (progressed)
        self.started_at: float | None = None  # unix seconds of the (last) spawn
        self.ready_at: float | None = None  # unix seconds when /health first answered 200
        self.spawned = asyncio.Event()  # set once a child exists (pid known)
        self.exited = asyncio.Event()  # set once the final child has exited and been reaped
        self.exit_cause: Cause | None = None  # why the child died on its own (runner.crash), else None
        self.exit_detail: str | None = None  # a fuller cause where known (``hung (no /health answer ...)``)

    # ----------------------------------------------------------------------------------- properties
    @property
    def state(self) -> RunnerState:
        return self._state

    @property
    def pid(self) -> int | None:
        return self._child.proc.pid if self._child else None

    @property
    def port(self) -> int | None:
        return self._child.port if self._child else None

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` of the child (IPv6 hosts in brackets); RunnerError before a spawn."""
        if self._child is None:
            raise RunnerError("llama-server has not been started")
        return self._url(self._child.port)

    @property
    def returncode(self) -> int | None:
        """Exit status once exited (negative = killed by that signal), else None."""
        return self._child.proc.returncode if self._child else None

    @property
    def log_path(self) -> Path:
        return self._log.path

    def log_tail(self, n: int = 20) -> list[str]:
        """The child's last ``n`` output lines, oldest first."""
        return self._log.tail(n)

    @property
    def log_lines(self) -> list[str]:
        """The whole ring buffer of recent output lines (for memory-breakdown parsing)."""
        return self._log.lines

    # ----------------------------------------------------------------------------------------- start
    async def start(self) -> None:
        """Spawn the child and return once ``GET /health`` answers 200 (state READY).

        Raises:
            RunnerError: the child exited while loading (message: exit code and its last lines), could
                not be run, was stopped meanwhile, or this instance was already started.
            LoadTimeout: no output for ``stall_timeout`` seconds while loading; the child is killed.
            asyncio.CancelledError: the caller went away; the child is killed first.
        On any failure the state is FAILED (STOPPED if ``stop()`` was called) and no child is left.
        """
        if self._start_called:
            raise RunnerError("this llama-server was already started; make a new one to restart")
        self._start_called = True
        if self._stop_requested:
            raise RunnerError("llama-server was stopped before it started")
        self._state = RunnerState.STARTING
        self._log.open()
        try:
            await self._start_attempts()
        except BaseException as exc:
            await asyncio.shield(self._kill_and_reap())
            self._state = RunnerState.STOPPED if self._stop_requested else RunnerState.FAILED
            self._log.note(f"start failed: {type(exc).__name__}: {exc}")
            self._log.close()
            self.exited.set()
            raise
        self._state = RunnerState.READY
        self.ready_at = time.time()
        self._log.note(f"ready on {self.base_url}")
        child = self._child
        if self._watchdog.enabled and child is not None:
            self._health_task = asyncio.create_task(
                watch(self.base_url, self._watchdog, lambda reason: self._hung(child, reason),
                      progress=lambda: max(self._last_output, self._last_progress)))

    async def _start_attempts(self) -> None:
        for attempt in (1, 2):
            port = self._fixed_port if self._fixed_port is not None else self._free_port()
            child = await self._spawn(port)
            try:
                await self._await_ready(child)
                if self._stop_requested:  # stop() raced the last health poll: do not report READY
                    raise RunnerError("llama-server was stopped while loading")
                return
            except BindFailed:
                if attempt == 2 or self._fixed_port is not None or self._stop_requested:
                    raise
                self._log.note(f"port {port} was taken; retrying on another port")

    async def _spawn(self, port: int) -> Child:
        async with self._spawn_lock:
            if self._stop_requested:
                raise RunnerError("llama-server was stopped before it started")
            argv = build_argv(self.binary, self.spec, host=self._host, port=port)
            self._log.note("starting: " + shlex.join(argv))
            proc = await spawn(argv, self._env)
            self._last_output = asyncio.get_running_loop().time()
            self.started_at = time.time()
            child = Child(proc=proc, port=port, first_line=self._log.count)
            assert proc.stdout is not None and proc.stderr is not None
            child.tasks = [
                asyncio.create_task(self._log.drain(proc.stdout, "stdout", self._on_output)),
                asyncio.create_task(self._log.drain(proc.stderr, "stderr", self._on_output)),
            ]
            child.tasks.append(asyncio.create_task(self._watch(child, child.tasks[:2])))
            self._child = child
            self.spawned.set()
            return child

    async def _await_ready(self, child: Child) -> None:
        """Race the health poll against the child's exit and the output stall timer."""
        loop = asyncio.get_running_loop()
        poll = asyncio.create_task(poll_health(self._url(child.port), self._poll_interval))
        died = asyncio.create_task(child.done.wait())
        try:
            while True:
                remaining = self._last_output + self._stall_timeout - loop.time()
                if remaining <= 0:
                    raise LoadTimeout(
                        f"llama-server printed nothing for {self._stall_timeout:g} s while loading "
                        f"(load stall timeout {self._stall_timeout:g} s) and was killed; last lines: "
                        + "\n".join(self._own_tail(child))
                    )
                done, _ = await asyncio.wait((poll, died), timeout=remaining, return_when="FIRST_COMPLETED")
                if died in done or child.proc.returncode is not None:
                    await child.done.wait()
                    raise self._exit_error(child)
                if poll in done:
                    poll.result()
                    return
        finally:
            poll.cancel()
            died.cancel()
            await asyncio.gather(poll, died, return_exceptions=True)

    def _own_tail(self, child: Child) -> list[str]:
        """The last lines printed by ``child`` itself (not by an earlier attempt)."""
        return self._log.tail(min(self._log.count - child.first_line, _EXIT_TAIL_LINES))

    def _exit_error(self, child: Child) -> RunnerError:
        if self._stop_requested:
            return RunnerError("llama-server was stopped while loading")
        error, cause = load_exit_error(self._own_tail(child), self._own_lines(child), child.proc.returncode,
                                       f"{self._host}:{child.port}")
        if cause is not None:
            self.exit_cause = cause
        return error

    def _own_lines(self, child: Child) -> list[str]:
        """Every line ``child`` printed that the ring buffer still holds (for runner.crash)."""
        return self._log.tail(self._log.count - child.first_line)

    # ------------------------------------------------------------------------------- child plumbing
    def _free_port(self) -> int:
        try:
            return free_port(self._host)
        except OSError as exc:
            raise RunnerError(f"cannot find a free port on {self._host}: {exc}") from exc

    def _on_output(self) -> None:
        """Any output at all (a chunk, not only a full line) resets the load stall timer."""
        self._last_output = asyncio.get_running_loop().time()

    def progressed(self) -> None:
        """Bytes of an answer arrived from the child (the gateway's relay): it is alive (runner.health)."""
        self._last_progress = asyncio.get_running_loop().time()

    async def _watch(self, child: Child, drains: list[asyncio.Task[None]]) -> None:
        """Await the child's exit; report a death while READY at once."""
        code = await child.proc.wait()
        self._cancel_health()
        signal_group(child, signal.SIGKILL)  # anything left in its process group
        _, pending = await asyncio.wait(drains, timeout=_DRAIN_GRACE)
        for task in pending:  # a process outside the group holds the pipe: stop reading it
            task.cancel()
        child.done.set()
        if child is not self._child or self._state is not RunnerState.READY:
            return  # start() or stop() reports this exit
        self._state = RunnerState.FAILED
        if self._hung_reason is not None:
            self.exit_cause, self.exit_detail = Cause.HUNG, self._hung_reason
        else:
            self.exit_cause = classify(self._own_lines(child), code)
        tail = self._log.tail(_EXIT_TAIL_LINES)
        logger.warning(
            "llama-server for %s (pid %d) exited with code %d while serving (%s); last lines:\n%s",
            self.spec.alias, child.proc.pid, code, self.exit_detail or self.exit_cause.value, "\n".join(tail),
        )  # fmt: skip
        self._log.note(f"exited with code {code} while serving")
        self._log.close()
        self.exited.set()
        if self._on_exit is not None:
            try:
                self._on_exit(self)
            except Exception:
                logger.exception("on_exit callback for %s failed", self.spec.alias)

    def _hung(self, child: Child, reason: str) -> None:
        """The watchdog gave up on ``child``: SIGKILL its group; :meth:`_watch` reports the exit."""
        if child is not self._child or self._state is not RunnerState.READY:
            return
        self._hung_reason = reason
        logger.warning("llama-server for %s (pid %d) is %s: killing it", self.spec.alias, child.proc.pid,
                       reason)
        self._log.note(f"{reason}: SIGKILL")
        signal_group(child, signal.SIGKILL)

    def _cancel_health(self) -> None:
        if self._health_task is not None and self._health_task is not asyncio.current_task():
            self._health_task.cancel()

    async def _kill_and_reap(self) -> None:
        child = self._child
        if child is not None:
            signal_group(child, signal.SIGKILL)
            await child.done.wait()

    def _url(self, port: int) -> str:
        return url(self._host, port)

    # ------------------------------------------------------------------------------------------ stop
    async def stop(self, grace: float = 10.0) -> None:
        """Stop the child: SIGTERM to its process group, up to ``grace`` seconds, then SIGKILL; reap it.

        Idempotent and safe to call concurrently or during ``start()`` (which then fails with
        RunnerError). Ends in STOPPED with the log file closed; ``on_exit`` is not called. The 10 s
        default grace matches llama-server's own router (``stop-timeout``).
        """
        if self._stop_task is None:
            self._stop_task = asyncio.create_task(self._stop(grace))
        await asyncio.shield(self._stop_task)

    async def _stop(self, grace: float) -> None:
        async with self._spawn_lock:  # no spawn can be half done while we look at the child
            self._stop_requested = True
        child = self._child
        try:
            self._cancel_health()
            if child is not None:
                self._state = RunnerState.STOPPING
                # Whatever fails in it (or a cancelled caller: stop() shields this task), the group ends.
                await stop_group(child, grace, self._log.note)
        finally:
            self._state = RunnerState.STOPPED
            self._log.close()
            self.exited.set()

    async def wait_exit(self) -> int:
        """Wait until the child has exited and return its exit status (negative = signal number).

        Raises:
            RunnerError: no child was ever spawned (``start()`` failed before it, or ``stop()`` came first).
        """
        await self.exited.wait()
        code = self.returncode
        if code is None:
            raise RunnerError("llama-server was never started")
        return code
