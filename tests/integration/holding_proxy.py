"""A loopback TCP proxy that holds a transfer in the middle until the test lets it go, so that a pull in
progress can be seen without guessing how long it takes.

``HoldingProxy(target, hold_after=N)`` stops passing a connection's bytes towards the client once more
than ``N`` have gone (a blob's body half-sent); ``HoldingProxy(target, hold_request=b"/blobs/")`` stops
before passing on a request whose bytes contain that text (nothing of the blob sent yet). Either way
:attr:`held` is set when a connection is held and :meth:`release` lets every connection go on. Every
other byte passes as it comes.
"""

from __future__ import annotations

import socket
import threading

HOLD_LIMIT_S = 120.0  # a test that never releases still ends


class HoldingProxy:
    """A TCP proxy on ``127.0.0.1`` to ``target`` (``(host, port)``; connected per client connection)."""

    def __init__(self, target: tuple[str, int], *, hold_after: int | None = None,
                 hold_request: bytes | None = None) -> None:
        self.target, self.hold_after, self.hold_request = target, hold_after, hold_request
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.host = f"127.0.0.1:{self.port}"
        self.held = threading.Event()
        self._go = threading.Event()
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def release(self) -> None:
        """Let every held connection go on (and hold none from now on)."""
        self._go.set()

    def close(self) -> None:
        self._closing = True
        self._go.set()
        self.listener.close()

    def _hold(self) -> None:
        if not self._go.is_set():
            self.held.set()
            self._go.wait(HOLD_LIMIT_S)

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                _shut(client)
                continue
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                if self.hold_request is not None and self.hold_request in data:
                    self._hold()
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            _shut(upstream)

    def _down(self, upstream: socket.socket, client: socket.socket) -> None:
        sent = 0
        try:
            while data := upstream.recv(65536):
                limit = self.hold_after
                if limit is not None and sent + len(data) > limit and not self._go.is_set():
                    head = max(0, limit - sent)
                    client.sendall(data[:head])
                    sent, data = sent + head, data[head:]
                    self._hold()
                client.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            _shut(client)
            _shut(upstream)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
