"""The plumbing of one llama-server child process: spawning it in its own process group, signalling
that group, polling ``/health`` until it is ready, and the error a failed load turns into.

No state of its own: :class:`llmman.runner.process.LlamaServerProcess` owns the child and calls these.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from llmman.errors import RunnerError
from llmman.runner.crash import Cause, classify
from llmman.runner.orphans import die_with_parent_hook

POLL_TIMEOUT = 2.0  # seconds for one GET /health


class BindFailed(RunnerError):
    """The child exited because its port was taken (llama-server: ``couldn't bind HTTP server socket``)."""


@dataclass(eq=False)
class Child:
    """One spawned process: ``first_line`` is ChildLog.count when it was spawned (its own lines come
    after); ``done`` is set once it is reaped and its pipes drained; ``tasks`` drain and watch it."""

    proc: asyncio.subprocess.Process
    port: int
    first_line: int
    done: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


async def spawn(argv: Sequence[str], env: Mapping[str, str]) -> asyncio.subprocess.Process:
    """Start ``argv`` with piped stdout/stderr, no stdin, in its own process group (so a stop signals
    the whole group) and killed with the daemon even by SIGKILL (runner.orphans).

    Raises:
        RunnerError: the binary cannot be run (missing, not executable).
    """
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
            preexec_fn=die_with_parent_hook(),
        )
    except OSError as exc:
        raise RunnerError(f"cannot run llama-server {argv[0]!r}: {exc}") from exc


def signal_group(child: Child, sig: signal.Signals) -> None:
    """Send ``sig`` to ``child``'s process group; nothing if the group is gone already."""
    try:
        os.killpg(child.proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def stop_group(child: Child, grace: float, note: Callable[[str], None]) -> None:
    """Stop ``child``'s process group: SIGTERM, up to ``grace`` seconds, then SIGKILL; reap it. Whatever
    happens meanwhile (a cancelled caller too), the group ends: SIGKILL, awaited shielded. ``note`` writes
    each step to the child's log."""
    try:
        if child.proc.returncode is None:
            signal_group(child, signal.SIGTERM)  # first: nothing before it may keep the child
            note(f"stopping: SIGTERM, {grace:g} s grace")
            try:
                await asyncio.wait_for(child.done.wait(), grace)
            except TimeoutError:
                note("still running after the grace period: SIGKILL")
                signal_group(child, signal.SIGKILL)
        await child.done.wait()
        note(f"stopped, exit code {child.proc.returncode}")
    finally:
        if not child.done.is_set():
            signal_group(child, signal.SIGKILL)
            await asyncio.shield(child.done.wait())


def url(host: str, port: int) -> str:
    """``http://HOST:PORT`` (an IPv6 host in brackets)."""
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


async def poll_health(base: str, interval: float) -> None:
    """Return once ``GET base/health`` answers 200; 503 (loading), other codes and errors mean poll again
    after ``interval`` seconds. A fresh connection per poll: a pooled one from the loading phase can go
    stale."""
    timeout = aiohttp.ClientTimeout(total=POLL_TIMEOUT)
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        while True:
            try:
                async with session.get(base + "/health") as resp:
                    await resp.read()
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(interval)


def load_exit_error(tail: list[str], lines: list[str], code: int | None, where: str
                    ) -> tuple[RunnerError, Cause | None]:
    """The error for a child that exited while loading, and its classified cause (None for a port
    clash, which the caller retries on another port).

    Args:
        tail: the child's last lines, quoted in the message.
        lines: every line of the child the log still holds (runner.crash.classify reads them).
        code: its exit status.
        where: ``host:port`` it tried to bind.
    """
    if any("couldn't bind" in line for line in tail):
        return BindFailed(f"llama-server could not bind {where}: " + "\n".join(tail)), None
    cause = classify(lines, code)
    error = RunnerError(f"llama-server exited with code {code} while loading ({cause.value}): "
                        + "\n".join(tail))
    error.cause = cause.value
    return error, cause
