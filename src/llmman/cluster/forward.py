"""Sending a request on to a peer: the same method, path and bytes, plus ``x-llmman-hop: 1``.

Only the client headers a peer needs travel (:data:`PASSED`): never its credentials (the peer key does,
see :class:`Peers.headers`), cookies, proxy credentials or hop-by-hop headers. :func:`open_forward`
returns once the peer's status line arrived, so a failure before that can still be retried on the next
candidate (api/inference.py); a failure after it ends the stream with the dialect's in-band frame
(api/relay.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import aiohttp

from llmman.cluster.peers import PROBE_TIMEOUT_S, Peers
from llmman.cluster.source import SOURCE, SOURCE_DIGEST
from llmman.config.table import HostAddress

#: The client headers a peer needs to serve the request the same way; every other one stays here
#: (cookies, proxy credentials, the client's own API key, hop-by-hop headers, a source the client wrote).
PASSED = frozenset({
    "content-type", "accept", "user-agent", "anthropic-version", "anthropic-beta", "openai-beta",
    "x-request-id", "traceparent", "tracestate", "origin",
})
RESPONSE_DROP = frozenset({
    "connection", "keep-alive", "transfer-encoding", "content-length", "server", "date",
})


def forward_headers(client_headers: Iterable[tuple[str, str]], peers: Peers,
                    source: str | None = None, digest: str = "") -> dict[str, str]:
    """The headers sent to the peer: the client's that the peer needs (:data:`PASSED`; never cookies,
    credentials or hop-by-hop headers), plus ours (the hop mark and peer key, ``source`` and its manifest
    ``digest`` when we know where to copy from)."""
    out = {k: v for k, v in client_headers if k.lower() in PASSED}
    out.update(peers.headers())
    out["Accept-Encoding"] = "identity"
    if source:
        out[SOURCE] = source
        if digest:
            out[SOURCE_DIGEST] = digest
    return out


async def open_forward(peers: Peers, address: HostAddress, method: str, path_qs: str, body: bytes,
                       headers: dict[str, str], read_timeout: float | None = None) -> aiohttp.ClientResponse:
    """Send the request and wait for the status line. Connecting is limited to the probe timeout;
    ``read_timeout`` (seconds; None = no limit, the daemon passes ``server.load_timeout`` since a cold
    peer loads first) limits the wait for the first byte and, once streaming, every gap between bytes
    (aiohttp's ``sock_read``; a stall then raises ``aiohttp.ServerTimeoutError`` while reading).
    The caller must release the response.

    Raises:
        OSError, aiohttp.ClientError, TimeoutError: the peer failed or stayed silent before answering.
    """
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=PROBE_TIMEOUT_S, sock_read=read_timeout)
    return await peers.session.request(method, address.client_url() + path_qs, data=body, headers=headers,
                                       timeout=timeout, auto_decompress=False, allow_redirects=False)
