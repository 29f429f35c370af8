"""The bulk-data GET of a blob on ``http.client``: about 3x the throughput of httpx's streaming on
loopback, which matters for multi-GB layers (bench/bench_pull.py). The sink either takes the socket and
moves the body with ``splice(2)`` (plain HTTP) or lends buffers that ``readinto`` fills.

Auth is settled beforehand by a ``HEAD`` through :class:`RegistryClient` (so its token or basic
credentials apply); redirects (blob storage behind the registry) are followed up to :data:`MAX_REDIRECTS`
times, dropping ``Authorization`` when the host changes (OCI distribution-spec 1.1, "Pulling blobs": a
registry may answer 307 to another location).
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urljoin, urlsplit

from llmman.registry.client import RegistryClient, RegistryError, RegistryUnavailable, summarise

MAX_REDIRECTS = 5


class BodySink(Protocol):
    """Where a blob's body goes: :meth:`buffer` lends a buffer to read into, :meth:`push` takes back its
    first ``n`` bytes (the network thread never waits for the bytes to be written or hashed)."""

    def buffer(self) -> memoryview: ...

    def push(self, n: int) -> None: ...

    def splice(self, response: http.client.HTTPResponse, sock: socket.socket | None) -> bool:
        """Consume the whole body straight from ``sock`` if the sink can (True), else do nothing."""
        ...


def get_blob(client: RegistryClient, path: str, headers: dict[str, str],
             open_sink: Callable[[int], BodySink]) -> int:
    """GET ``client.base + path`` with ``headers``; ``open_sink`` gets the final status (200 or 206)
    before the body and returns the sink the body is read into; returns the status. Raises
    RegistryUnavailable for transport failures, stalls and 5xx/429 (retryable), RegistryError for other
    statuses; whatever the sink raises passes through."""
    url = client.base + path
    for _ in range(MAX_REDIRECTS + 1):
        client.check_destination(url)  # offline: loopback only, redirects to blob storage included
        parts = urlsplit(url)
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(parts.netloc, timeout=client.stall_timeout, context=client.tls)
        else:
            conn = http.client.HTTPConnection(parts.netloc, timeout=client.stall_timeout)
        response: http.client.HTTPResponse | None = None
        try:
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            try:
                conn.request("GET", target, headers=headers)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise RegistryUnavailable(f"{parts.netloc}: {exc or type(exc).__name__}") from exc
            status = response.status
            if status in (301, 302, 303, 307, 308):
                location = response.getheader("location")
                if not location:
                    raise RegistryError(f"{parts.netloc}: redirect without Location")
                url = urljoin(url, location)
                if urlsplit(url).netloc != parts.netloc:
                    headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
                continue
            if status >= 300:
                text = summarise(status, response.read(65536))
                error = RegistryUnavailable if status >= 500 or status in (401, 429) else RegistryError
                raise error(f"{path}: registry answered {text}")
            sink = open_sink(status)
            if sink.splice(response, conn.sock):
                return status
            while True:
                buf = sink.buffer()
                try:
                    n = response.readinto(buf)
                except (OSError, http.client.HTTPException) as exc:
                    raise RegistryUnavailable(f"{parts.netloc}: {exc or type(exc).__name__}") from exc
                if not n:
                    if response.length:  # http.client's readinto ends short bodies silently
                        raise RegistryUnavailable(f"{parts.netloc}: connection closed with "
                                                  f"{response.length} bytes still to come")
                    return status
                sink.push(n)
        finally:
            if response is not None:
                response.close()  # its file object holds the socket open past conn.close()
            conn.close()
    raise RegistryError(f"{path}: more than {MAX_REDIRECTS} redirects")
