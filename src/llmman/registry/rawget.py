"""The bulk-data GET of a blob on ``http.client`` (``readinto`` a reused buffer): about 3x the throughput
of httpx's streaming on loopback, which matters for multi-GB layers (bench/bench_pull.py).

Auth is settled beforehand by a ``HEAD`` through :class:`RegistryClient` (so its token or basic
credentials apply); redirects (blob storage behind the registry) are followed up to :data:`MAX_REDIRECTS`
times, dropping ``Authorization`` when the host changes (OCI distribution-spec 1.1, "Pulling blobs": a
registry may answer 307 to another location).
"""

from __future__ import annotations

import http.client
from collections.abc import Callable
from urllib.parse import urljoin, urlsplit

from llmman.registry.client import RegistryClient, RegistryError, RegistryUnavailable

MAX_REDIRECTS = 5
BUFFER = 1 << 20


def get_blob(client: RegistryClient, path: str, headers: dict[str, str], on_status: Callable[[int], None],
             sink: Callable[[memoryview], None]) -> int:
    """GET ``client.base + path`` with ``headers``; ``on_status`` gets the final status (200 or 206) before
    the body, then ``sink`` each piece of it; returns the status. Raises RegistryUnavailable for transport
    failures, stalls and 5xx/429 (retryable), RegistryError for other statuses."""
    url = client.base + path
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(parts.netloc, timeout=client.stall_timeout, context=client.tls)
        else:
            conn = http.client.HTTPConnection(parts.netloc, timeout=client.stall_timeout)
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
                text = response.read(300).decode("utf-8", "replace")
                error = RegistryUnavailable if status >= 500 or status in (401, 429) else RegistryError
                raise error(f"{path}: registry answered {status}: {text}")
            on_status(status)
            buf = bytearray(BUFFER)
            view = memoryview(buf)
            while True:
                try:
                    n = response.readinto(buf)
                except (OSError, http.client.HTTPException) as exc:
                    raise RegistryUnavailable(f"{parts.netloc}: {exc or type(exc).__name__}") from exc
                if not n:
                    return status
                sink(view[:n])
        finally:
            conn.close()
    raise RegistryError(f"{path}: more than {MAX_REDIRECTS} redirects")
