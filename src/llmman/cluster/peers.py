"""The peer list and the probe every cold request makes (``GET /llmman/node`` on each peer at once).

A peer that fails (refused, timed out after :data:`PROBE_TIMEOUT_S`, answered non-200 — a 401 for a
key it does not accept included — or sent something that is not a node document) is left out of that
decision and remembered as down: later decisions skip it without waiting, while one background task
re-probes it every :data:`RETRY_S` seconds and takes it back as soon as it answers. Requests that
arrive while a probe is in flight share its answer instead of asking every peer again, and
:attr:`Peers.recent` remembers for a moment which peer has a model loaded (see :mod:`.recent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import aiohttp

from llmman.cluster.placement import LOCAL, NodeView
from llmman.cluster.recent import LOADED_TTL_S, RecentLoaded
from llmman.cluster.source import is_self
from llmman.cluster.state import node_document, parse_node
from llmman.config.table import HostAddress, parse_host
from llmman.errors import ConfigError
from llmman.sched.scheduler import Scheduler
from llmman.store import Store

log = logging.getLogger("llmman.cluster")

PROBE_TIMEOUT_S = 3.0
RETRY_S = 2.0
HOP = "x-llmman-hop"


def parse_peers(entries: Iterable[str], own: HostAddress | None = None) -> tuple[HostAddress, ...]:
    """``("asahi", "spark:17434", "https://10.0.0.5")`` (``Settings.peer_list``) -> addresses (port 17434 by
    default, 80/443 with a scheme).

    An entry that is this node itself (``own``, its ``LLMMAN_HOST``; see :func:`source.is_self`) is
    dropped with a log line: a node forwarding to itself would only loop.

    Raises:
        ConfigError: an entry that does not parse as ``LLMMAN_HOST`` does, or names no host
            (``http://``), naming it.
    """
    peers: list[HostAddress] = []
    for part in entries:
        if part.strip():
            hostport = part.strip().strip("\"'").split("://", 1)[-1].split("/", 1)[0]
            if not hostport or (hostport.startswith(":") and hostport.count(":") == 1):
                raise ConfigError(f"aggregation.peers: {part.strip()!r} names no host")
            try:
                address = parse_host(part)
            except ConfigError as exc:
                raise ConfigError(f"aggregation.peers: {exc.message}") from None
            if own is not None and is_self(address, own):
                log.info("aggregation.peers: %s is this node itself; left out", address.netloc)
                continue
            peers.append(address)
    return tuple(dict.fromkeys(peers))


def peer_name(address: HostAddress) -> str:
    """How a peer is named in lists and logs: ``host:port``."""
    return address.netloc


def local_view(scheduler: Scheduler, store: Store, *, name: str = "", fallback: bool = False) -> NodeView:
    """This node as :class:`NodeView`: its own ``/llmman/node`` document, read as a peer reads it."""
    view = parse_node(LOCAL, "", node_document(scheduler, store, name=name, fallback=fallback, max_queue=0))
    assert view is not None  # our own document always parses
    return view


class Peers:
    """The peers of this node and what is known about their health.

    Args:
        session: the aiohttp session for peer traffic (TLS settings included).
        peers: the parsed ``aggregation.peers``.
        api_key: the peer key sent as ``Authorization: Bearer``; empty = none.
        timeout: seconds a probe waits for a peer; retry: seconds between re-probes of a down peer.
        loaded_ttl: seconds a model seen loaded on a peer is forwarded there without a new probe.
    """

    def __init__(self, session: aiohttp.ClientSession, peers: tuple[HostAddress, ...], *,
                 api_key: str = "", timeout: float = PROBE_TIMEOUT_S, retry: float = RETRY_S,
                 loaded_ttl: float = LOADED_TTL_S) -> None:
        self.session = session
        self.addresses = peers
        self.api_key = api_key
        self.timeout = timeout
        self.retry = retry
        self._down: dict[str, str] = {}  # peer name -> why
        self._retry_task: asyncio.Task[None] | None = None
        self._probing: asyncio.Future[list[NodeView]] | None = None
        self.recent = RecentLoaded(loaded_ttl)
        self._forwarding: dict[tuple[str, str], int] = {}  # (peer, reference lower-cased) -> open

    def __bool__(self) -> bool:
        return bool(self.addresses)

    def headers(self) -> dict[str, str]:
        """What every request to a peer carries: the hop mark and the peer key."""
        out = {HOP: "1"}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out

    def up(self) -> list[HostAddress]:
        """The peers not remembered as down."""
        return [a for a in self.addresses if peer_name(a) not in self._down]

    def mark_down(self, address: HostAddress, why: str) -> None:
        """Skip ``address`` until a background re-probe sees it answer again."""
        name = peer_name(address)
        self.recent.forget_peer(address)
        if name not in self._down:
            log.info("peer %s left out: %s", name, why)
        self._down[name] = why
        if self._retry_task is None or self._retry_task.done():
            self._retry_task = asyncio.create_task(self._reprobe())

    async def get_json(self, address: HostAddress, path: str) -> object:
        """GET ``path`` on a peer with the peer headers, within the probe timeout.

        Raises:
            OSError, aiohttp.ClientError, TimeoutError, ValueError: the peer failed in some way.
        """
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with self.session.get(address.client_url() + path, headers=self.headers(),
                                    timeout=timeout) as response:
            if response.status != 200:
                raise ValueError(f"{path} answered {response.status}")
            doc: object = await response.json(content_type=None)
            return doc

    async def _probe_one(self, address: HostAddress) -> NodeView | None:
        name = peer_name(address)
        try:
            view = parse_node(name, address.client_url(), await self.get_json(address, "/llmman/node"))
            if view is None:
                raise ValueError("not a node document")
        except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            why = str(exc) or type(exc).__name__
            log.debug("placement: skipping peer %s: %s", name, why)
            self.mark_down(address, why)
            return None
        return view

    @contextlib.contextmanager
    def forwarding(self, address: HostAddress, ref: str) -> Iterator[None]:
        """Count one request forwarded to ``address`` for model ``ref`` while it runs (optimistic
        accounting: a burst sees the requests it sent before the peer's next state says so)."""
        key = (peer_name(address), ref.lower())
        self._forwarding[key] = self._forwarding.get(key, 0) + 1
        try:
            yield
        finally:
            self._forwarding[key] -= 1
            if not self._forwarding[key]:
                del self._forwarding[key]

    def forwarded(self, address: HostAddress, ref: str) -> int:
        """Requests this node has open on ``address`` for ``ref`` now."""
        return self._forwarding.get((peer_name(address), ref.lower()), 0)

    async def current(self) -> list[NodeView]:
        """The peers' views to decide on: the background refresh's when fresh, else one probe round."""
        return await self.probe()

    async def probe(self) -> list[NodeView]:
        """Every peer not known to be down, asked at once; the ones that answered in time. A call made
        while another is in flight waits for that one's answer (one fan-out serves a burst)."""
        if self._probing is None or self._probing.done():
            self._probing = asyncio.ensure_future(self._probe_all())
        return list(await asyncio.shield(self._probing))

    async def _probe_all(self) -> list[NodeView]:
        views = await asyncio.gather(*(self._probe_one(a) for a in self.up()))
        return [v for v in views if v is not None]

    async def gather(self, path: str) -> list[tuple[HostAddress, Any]]:
        """GET ``path`` on every peer not known to be down, at once; ``(peer, document)`` of those
        that answered 200 with JSON in time (the others are marked down)."""
        async def one(address: HostAddress) -> tuple[HostAddress, Any] | None:
            try:
                return address, await self.get_json(address, path)
            except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self.mark_down(address, str(exc) or type(exc).__name__)
                return None

        found = await asyncio.gather(*(one(a) for a in self.up()))
        return [f for f in found if f is not None]

    async def _reprobe(self) -> None:
        """Re-probe the down peers every ``retry`` seconds until none is left."""
        by_name: Mapping[str, HostAddress] = {peer_name(a): a for a in self.addresses}
        while self._down:
            await asyncio.sleep(self.retry)
            for name in list(self._down):
                address = by_name[name]
                try:
                    if parse_node(name, "", await self.get_json(address, "/llmman/node")) is not None:
                        self._down.pop(name, None)
                        log.info("peer %s is back", name)
                except (OSError, aiohttp.ClientError, TimeoutError, ValueError):
                    continue

    async def close(self) -> None:
        """Stop the background re-probe."""
        if self._retry_task is not None:
            self._retry_task.cancel()
            with contextlib.suppress(BaseException):
                await self._retry_task
