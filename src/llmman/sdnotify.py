"""systemd's notification protocol (``sd_notify(3)``): one datagram of ``KEY=VALUE`` lines to its socket.

A unit with ``Type=notify`` waits for ``READY=1`` before it counts the service as started; ``WatchdogSec=``
expects ``WATCHDOG=1`` at least every ``WATCHDOG_USEC`` microseconds; ``STOPPING=1`` and ``STATUS=...`` say
what the service is doing. The socket path comes from
:attr:`llmman.config.environment.Environment.notify_socket` (this module reads no environment); a leading
``@`` names a socket in Linux's abstract namespace. Outside systemd (no socket) every call does nothing.

:class:`Watchdog` is the ``WatchdogSec=`` half: a task on the daemon's event loop that sends ``WATCHDOG=1``
every half ``WATCHDOG_USEC`` only while a health check passes. Being a task on the loop is the loop check:
a loop wedged by a blocking call runs no task, so the pings stop and systemd restarts the service; a failed
check withholds the ping too (and says why in ``STATUS=``), so two failed checks in a row (one
``WatchdogSec``) are a restart. :func:`watchdog_interval` reads systemd's variables.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

__all__ = ["MIN_PING_S", "Notifier", "Watchdog", "watchdog_interval"]

log = logging.getLogger("llmman")

MIN_PING_S = 0.01
"""The shortest wait between pings: a ``WatchdogSec=`` of a few microseconds (a typo, ``WATCHDOG_USEC=1``)
would otherwise have the loop send pings and run health checks without pause, most of a core. A watchdog
that short cannot be met anyway: systemd restarts the service, as it should for a unit that asks the
impossible."""


class Notifier:
    """Sends notifications to one ``NOTIFY_SOCKET``; a no-op when ``path`` is empty."""

    def __init__(self, path: str) -> None:
        self._address = "\0" + path[1:] if path.startswith("@") else path

    @property
    def enabled(self) -> bool:
        """Whether there is a socket to notify (the process runs under a ``Type=notify`` unit)."""
        return bool(self._address)

    def notify(self, **fields: str) -> bool:
        """Send ``fields`` as ``KEY=VALUE`` lines (``notify(READY="1", STATUS="serving")``) in one datagram.

        Returns whether it was sent: False without a socket or when sending failed (systemd gone, socket
        removed, its queue full); a notification is advisory and never raises. The socket does not block,
        so a slow reader never stalls the event loop that sends.
        """
        if not self._address or not fields:
            return False
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX,
                               socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as sock:
                sock.sendto(payload, self._address)
        except OSError:
            return False
        return True


def watchdog_interval(usec: int, pid: int, own_pid: int) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings: half of ``WATCHDOG_USEC`` (``usec``, as
    ``sd_watchdog_enabled(3)`` advises) and never under :data:`MIN_PING_S`, or None when there is no
    watchdog (``usec`` 0) or it is meant for another process (``WATCHDOG_PID`` set and not ``own_pid``)."""
    if usec <= 0 or (pid and pid != own_pid):
        return None
    return max(MIN_PING_S, usec / 2 / 1_000_000)


class Watchdog:
    """Pings systemd's watchdog every ``interval`` seconds from the running event loop while ``problem()``
    returns None; a text from ``problem()`` (or an exception) withholds that ping and is sent as
    ``STATUS=unhealthy: ...``. ``serving`` is the ``STATUS=`` sent again when health comes back."""

    def __init__(self, notifier: Notifier, interval: float, problem: Callable[[], str | None],
                 *, serving: str = "serving") -> None:
        self._notifier = notifier
        self._interval = interval
        self._problem = problem
        self._serving = serving
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start pinging (on the running loop); a no-op once started or without a socket."""
        if self._task is None and self._notifier.enabled:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="llmman-sd-watchdog")

    def stop(self) -> None:
        """Stop pinging (the shutdown began: systemd stops its watchdog once told ``STOPPING=1``)."""
        if self._task is not None:
            self._task.cancel()

    async def close(self) -> None:
        """Stop pinging and wait for the task to end."""
        self.stop()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _check(self) -> str | None:
        try:
            return self._problem()
        except Exception as exc:  # a check that cannot run is a failed check, never a dead pinger
            return f"health check failed: {exc!r}"

    async def _run(self) -> None:
        healthy = True
        while True:
            await asyncio.sleep(self._interval)
            problem = self._check()
            if problem is None:
                self._notifier.notify(WATCHDOG="1", **({} if healthy else {"STATUS": self._serving}))
                if not healthy:
                    log.info("healthy again: watchdog pings resumed")
                healthy = True
                continue
            if healthy:
                log.warning("unhealthy (%s): withholding systemd's watchdog ping, so it restarts llmman "
                            "unless health comes back within WatchdogSec", problem)
            healthy = False
            self._notifier.notify(STATUS=f"unhealthy: {problem}; watchdog ping withheld")
