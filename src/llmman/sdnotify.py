"""systemd's notification protocol (``sd_notify(3)``): one datagram of ``KEY=VALUE`` lines to its socket.

A unit with ``Type=notify`` waits for ``READY=1`` before it counts the service as started; ``WatchdogSec=``
expects ``WATCHDOG=1`` at least every ``WATCHDOG_USEC`` microseconds; ``STOPPING=1`` and ``STATUS=...`` say
what the service is doing. The socket path comes from
:attr:`llmman.config.environment.Environment.notify_socket` (this module reads no environment); a leading
``@`` names a socket in Linux's abstract namespace. Outside systemd (no socket) every call does nothing.
"""

from __future__ import annotations

import socket

__all__ = ["Notifier"]


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
        removed); a notification is advisory and never raises.
        """
        if not self._address or not fields:
            return False
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(payload, self._address)
        except OSError:
            return False
        return True
