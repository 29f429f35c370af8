"""Sending a request on to a peer: the same method, path and bytes, plus ``x-llmman-hop: <this node>``.

Only the client headers a peer needs travel (:data:`PASSED`): never its credentials (the peer key does,
see :class:`Peers.headers`), cookies, proxy credentials or hop-by-hop headers. The hop header names the
node that forwarded (for the peer's logs); a receiving node only checks that it is there.

:func:`open_forward` returns once the peer's status line arrived, so a failure before that can still be
retried on the next candidate (api/inference.py); a failure after it ends the stream with the dialect's
in-band frame (api/relay.py).

Silence is checked, not only timed: while a peer sends nothing (no status line yet, or no next chunk of
its answer) for ``stall`` seconds, :func:`watched` asks it for ``/llmman/node`` (:func:`answers_probe`,
the probe's own 3 s limit). A peer that answers is alive (loading a large model, queueing) and is waited
for, up to ``server.load_timeout`` of silence (aiohttp's ``sock_read``); one that does not is given up at
once with :class:`PeerSilent`, and the connection to it is closed, which cancels the work there. The
pipeline asks more of the probe (:func:`works_on`), before the status line and mid-stream alike: a peer
whose document shows the model loaded, ready and idle is not working on the request (it stalled on its
way to the model, or lost it), and is given up the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import string
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar
from urllib.parse import quote

import aiohttp

from llmman.cluster.peers import HOP, PROBE_TIMEOUT_S, Peers, peer_name
from llmman.cluster.source import SOURCE, SOURCE_DIGEST
from llmman.cluster.state import parse_node
from llmman.config.table import HostAddress

log = logging.getLogger("llmman.cluster")

T = TypeVar("T")

#: The client headers a peer needs to serve the request the same way; every other one stays here
#: (cookies, proxy credentials, the client's own API key, hop-by-hop headers, a source the client wrote).
PASSED = frozenset({
    "content-type", "accept", "user-agent", "anthropic-version", "anthropic-beta", "openai-beta",
    "x-request-id", "traceparent", "tracestate", "origin",
})
RESPONSE_DROP = frozenset({
    "connection", "keep-alive", "transfer-encoding", "content-length", "server", "date",
})
#: The response header naming the node that served an inference request (api/inference.py).
NODE = "x-llmman-node"

Alive = Callable[[], Awaitable[bool]]

_SAFE = "".join(c for c in string.punctuation if c != "%") + " "


class PeerSilent(TimeoutError):
    """A peer sent nothing for a stall interval and did not answer its probe either: given up."""


def header_value(name: str) -> str:
    """``name`` (a node's name) safe as a header value: printable ASCII kept, anything else (control
    characters, non-ASCII) percent-encoded, so no configured name can break or add a header line."""
    return quote(name.strip(), safe=_SAFE) or "?"


def forward_headers(client_headers: Iterable[tuple[str, str]], peers: Peers,
                    source: str | None = None, digest: str = "", *, node: str = "") -> dict[str, str]:
    """The headers sent to the peer: the client's that the peer needs (:data:`PASSED`; never cookies,
    credentials or hop-by-hop headers), plus ours (the hop mark naming ``node``, this node, when given,
    the peer key, ``source`` and its manifest ``digest`` when we know where to copy from)."""
    out = {k: v for k, v in client_headers if k.lower() in PASSED}
    out.update(peers.headers())
    if node:
        out[HOP] = header_value(node)
    out["Accept-Encoding"] = "identity"
    if source:
        out[SOURCE] = source
        if digest:
            out[SOURCE_DIGEST] = digest
    return out


async def answers_probe(peers: Peers, address: HostAddress) -> bool:
    """True when the peer answers ``GET /llmman/node`` within the probe timeout (any 200 JSON). A peer
    the background refresh has already found silent (marked down) is not asked again: False at once."""
    if address not in peers.up():
        log.debug("peer %s is down (its state did not answer): not probing it again", peer_name(address))
        return False
    try:
        await peers.get_json(address, "/llmman/node")
    except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.debug("peer %s does not answer its probe: %s", peer_name(address), str(exc) or type(exc).__name__)
        return False
    return True


async def works_on(peers: Peers, address: HostAddress, ref: str) -> bool:
    """True when the peer answers its probe and is plausibly working on a request for ``ref``: unless
    its document shows ``ref`` loaded, ready and with no request on it at all — then a request sent to it
    that has been silent a stall interval is not with its model (it never reached it, or the model lost
    it: a peer that answers probes but stalls requests) and False. A copy loading, queued or serving, or
    a model not loaded there yet (a copy or load to come), is work, and an older node that publishes no
    per-model figures is given the benefit of the doubt."""
    try:
        doc = await peers.get_json(address, "/llmman/node")
    except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.debug("peer %s does not answer its probe: %s", peer_name(address), str(exc) or type(exc).__name__)
        return False
    view = parse_node(peer_name(address), "", doc)
    load = None if view is None else view.load_of(ref)
    if load is not None and not load.loading and load.busy == 0:
        log.info("peer %s answers its probe but holds no request for %s: the request stalled there",
                 peer_name(address), ref)
        return False
    return True


async def watched(work: Awaitable[T], alive: Alive, stall: float, *, what: str,
                  probe_first: bool = False, discard: Callable[[T], object] | None = None) -> T:
    """``work``'s result, asking ``alive()`` every ``stall`` seconds it has not finished (at once first
    when ``probe_first``); ``stall <= 0`` waits without asking.

    A probe runs alongside the work, so an answer arriving meanwhile is taken. ``work`` is cancelled when
    this raises or is cancelled; a result it produced that is not returned goes to ``discard``.

    Raises:
        PeerSilent: ``alive()`` answered False (``what`` names the silence in the message).
    """
    task = asyncio.ensure_future(work)
    handed = False
    try:
        if stall <= 0:
            result = await task
            handed = True
            return result
        wait = 0.0 if probe_first else stall
        while True:
            done, _ = await asyncio.wait({task}, timeout=wait)
            if task in done:
                handed = True
                return task.result()
            check = asyncio.ensure_future(alive())
            try:
                first, _ = await asyncio.wait((task, check), return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not check.done():
                    check.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await check
            if task in first:
                handed = True
                return task.result()
            if not check.result():
                raise PeerSilent(f"{what} for {stall:g} s and not answering its probe")
            log.debug("%s for %g s, but it answers its probe: still waiting", what, stall)
            wait = stall
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        elif not handed and not task.cancelled() and task.exception() is None and discard is not None:
            discard(task.result())  # it answered as we gave up: close what it sent


async def open_forward(peers: Peers, address: HostAddress, method: str, path_qs: str, body: bytes,
                       headers: dict[str, str], read_timeout: float | None = None,
                       stall: float = 0.0, alive: Alive | None = None) -> aiohttp.ClientResponse:
    """Send the request and wait for the status line. Connecting is limited to the probe timeout;
    ``read_timeout`` (seconds; None = no limit, the daemon passes ``server.load_timeout`` since a cold
    peer loads first) limits the wait for the first byte and, once streaming, every gap between bytes
    (aiohttp's ``sock_read``; a stall then raises ``aiohttp.ServerTimeoutError`` while reading). Every
    ``stall`` seconds without the status line the peer is probed (:func:`watched`; 0 = never) with
    ``alive`` (default :func:`answers_probe`; the pipeline passes :func:`works_on`). The caller must
    release the response.

    Raises:
        OSError, aiohttp.ClientError, TimeoutError: the peer failed or stayed silent before answering
            (:class:`PeerSilent`: silent and not answering its probe).
    """
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=PROBE_TIMEOUT_S, sock_read=read_timeout)
    sending = peers.session.request(method, address.client_url() + path_qs, data=body, headers=headers,
                                    timeout=timeout, auto_decompress=False, allow_redirects=False)
    return await watched(sending, alive or (lambda: answers_probe(peers, address)), stall,
                         what=f"peer {peer_name(address)} silent before answering",
                         discard=lambda response: response.close())


async def next_chunk(content: aiohttp.StreamReader, alive: Alive, stall: float, *, what: str) -> bytes:
    """The next bytes of a peer's answer, ``b""`` at its end. A gap of ``stall`` seconds asks ``alive()``
    (then again every ``stall`` seconds, :func:`watched`); 0 = no check.

    Raises:
        PeerSilent: the peer stayed silent and did not answer its probe.
        aiohttp.ClientError, OSError, TimeoutError: the answer broke (or ``sock_read`` ran out).
    """
    if stall <= 0:
        return await content.readany()
    try:
        async with asyncio.timeout(stall) as gap:
            return await content.readany()
    except TimeoutError:
        if not gap.expired():
            raise  # aiohttp's own read timeout, not our gap
    return await watched(content.readany(), alive, stall, what=what, probe_first=True)


class WatchedAnswer:
    """A peer's answer read to its end (:meth:`next`), its silences watched with one timer per ``stall``
    interval instead of one per chunk (:func:`next_chunk`'s way costs a timer a chunk, and a GPU peer
    sends one event a chunk).

    The rule is :func:`next_chunk`'s: a read that has waited ``stall`` seconds asks ``alive()`` (then
    again ``stall`` seconds after each probe that says yes, while the read still waits); a probe that
    says no ends the answer, the pending read raising :class:`PeerSilent`. Time spent sending to a slow
    client is not silence: the gap counts from the start of each read. Unlike :func:`next_chunk`, giving
    up ends the stream (the reader gets the error), so :meth:`close` it once done; ``stall <= 0`` never
    asks.
    """

    def __init__(self, content: aiohttp.StreamReader, alive: Alive, stall: float, *, what: str) -> None:
        self._content = content
        self._alive = alive
        self._stall = stall
        self._what = what
        self._loop = asyncio.get_running_loop()
        self._since = self._loop.time()
        self._reading = False
        self._timer: asyncio.TimerHandle | None = None
        self._probe: asyncio.Task[None] | None = None
        if stall > 0:
            self._timer = self._loop.call_at(self._since + stall, self._check)

    async def next(self) -> bytes:
        """The next bytes of the answer, ``b""`` at its end.

        Raises:
            PeerSilent: the peer stayed silent and did not answer its probe.
            aiohttp.ClientError, OSError, TimeoutError: the answer broke (or ``sock_read`` ran out).
        """
        self._since = self._loop.time()
        self._reading = True
        try:
            return await self._content.readany()
        finally:
            self._reading = False

    def close(self) -> None:
        """Stop watching (idempotent)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None

    def _check(self) -> None:
        self._timer = None
        now = self._loop.time()
        if not self._reading or now - self._since < self._stall:
            start = self._since if self._reading else now
            self._timer = self._loop.call_at(max(start + self._stall, now + 0.001), self._check)
            return
        self._probe = asyncio.ensure_future(self._ask())

    async def _ask(self) -> None:
        alive = await self._alive()
        self._probe = None
        now = self._loop.time()
        if not alive and self._reading and now - self._since >= self._stall:
            message = f"{self._what} for {self._stall:g} s and not answering its probe"
            self._content.set_exception(PeerSilent(message))
            return
        if alive:  # else the read it was asked about has ended: that silence is over
            log.debug("%s for %g s, but it answers its probe: still waiting", self._what, self._stall)
        self._timer = self._loop.call_at(now + self._stall, self._check)
