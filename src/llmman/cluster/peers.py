"""The peer list, what is known of each peer, and the probe a cold request makes when that is stale.

**Background state.** :meth:`Peers.start` runs one task per peer that fetches its ``GET /llmman/node``
every ``refresh`` seconds (``aggregation.refresh``), each wait drawn within ±20 % of it
(:func:`jittered`, so the peers of a pool do not all ask at once). Each answer is kept as a
:class:`Sighting` (the view, the peer's version and when it was asked, for "last seen").
:meth:`Peers.current` answers a decision from those sightings when every peer not known to be down was
seen within :data:`STALE_AFTER` refresh intervals; otherwise it does one probe round (:meth:`Peers.probe`),
so a cold request never needs more than one round. Either way the views carry the requests this node
forwarded since they were fetched (:mod:`.optimistic`). ``refresh`` 0 turns the background off: every
``current`` probes, as the seed did.

**Down peers.** A peer that fails (refused, timed out after :data:`PROBE_TIMEOUT_S`, answered non-200 — a
401 for a key it does not accept included — or sent something that is not a node document) is left out
of that decision and remembered as down: later decisions skip it without waiting, its refresh task
leaves it alone, and one background task re-probes the down peers every :data:`RETRY_S` seconds and
takes each back (with a fresh sighting) as soon as it answers.

**Slow is not dead.** A peer that did not answer *in time* (a timeout of the probe, of the connection or
of a forward's silence check: :func:`timed_out`) is *unresponsive*, not dead: it is left out of decisions
as a down peer is, but what it was last seen holding (its last sighting: loaded and stored models, with
its age) is kept, and :meth:`Peers.holding` names it for a model it holds, so the router answers 503
with ``Retry-After`` rather than 404 or a pull for a model only that peer has
(docs/aggregation.md#busy-is-not-down). A peer that refuses, is unreachable, resets the connection or
answers something else is dead as before. A failure reported without its exception (a forward's, through
:meth:`Peers.mark_down`) is judged by the peer's last probe: the silence check's own probe timing out
makes it unresponsive. A re-probe that finds it refusing makes it dead; one that answers takes it back.

**Peers not up yet.** One exception: a peer that has never answered and *refuses* the connection (its
host answered at once: nothing listens there yet, as when a pool's nodes start together) is not marked
down but *waiting*: it stays in every probe round and keeps the views from counting as fresh, so each
decision asks it again (a refusal costs no wait) and the first one after it starts listening sees it.
Once it has answered, it is a peer like the others.

**Shared fetches.** A fetch of one peer already in flight (its refresh, or another request's probe) is
joined rather than repeated, and calls of :meth:`Peers.probe` made while one round is in flight share its
answer: a burst costs each peer one request, and a failing peer is logged and marked down once.

:attr:`Peers.recent` remembers for a moment which peer has a model loaded (see :mod:`.recent`); with fresh
background views it saves nothing more, and it is kept for the router that reads it.

**Peers from DNS.** An entry naming a DNS name stands for every address it resolves to
(:mod:`.discovery`): :meth:`Peers.start` follows those names too, and each change of the set
(:meth:`Peers.update`) starts the refresh of a new peer and stops and forgets a removed one (its
sighting, down or waiting state, recent memory), so views, ``/llmman/pool`` and every decision see the
current set without a restart. A peer whose ``/llmman/node`` carries this node's own id
(:data:`.source.NODE_ID`, when the document has one) is this node by another address: it is dropped and
kept out; one whose document carries another peer's id is that peer at a second address (a node bound to
every address, a dual-stack pod): it is left out while that peer's address is in the set.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from llmman.cluster.discovery import Discovery, DnsEntry, Entry, is_dns_name
from llmman.cluster.optimistic import add_forwards
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
JITTER = 0.2  # each refresh wait is the interval ±20 %
STALE_AFTER = 3.0  # background views older than this many refresh intervals are not used
PEER_DOCUMENT_MAX = 16 * 1024 * 1024  # bytes of a peer's JSON answer taken (a store of ~100k models)
_FAILURES = (OSError, aiohttp.ClientError, TimeoutError, ValueError)


def timed_out(exc: BaseException) -> bool:
    """True when ``exc`` is a peer not answering in time (a probe's, a connection's or a read's timeout,
    a forward's silence check): the peer is unresponsive, not dead (see the module docstring)."""
    return isinstance(exc, TimeoutError)


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """``response``'s whole body.

    Raises:
        ValueError: it is (or says it is) longer than ``limit`` bytes; the rest is not read.
    """
    if response.content_length is not None and response.content_length > limit:
        raise ValueError(f"answer of {response.content_length} bytes (the most taken is {limit})")
    data = bytearray()
    while chunk := await response.content.readany():
        data += chunk
        if len(data) > limit:
            raise ValueError(f"answer over {limit} bytes")
    return bytes(data)


def refused(exc: BaseException) -> bool:
    """True when ``exc`` is a refused connection (the host answered at once that nothing listens)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return isinstance(exc.os_error, ConnectionRefusedError)
    return isinstance(exc, ConnectionRefusedError)


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


def parse_entries(entries: Iterable[str], own: HostAddress | None = None) -> tuple[Entry, ...]:
    """``Settings.peer_list`` as entries, in order: a static address (as :func:`parse_peers` makes it,
    this node itself left out) or, for a DNS name, a :class:`.discovery.DnsEntry` (see :mod:`.discovery`).

    Raises:
        ConfigError: an entry that does not parse, as :func:`parse_peers` says.
    """
    out: list[Entry] = []
    for part in entries:
        static = parse_peers((part,), own)  # checks the entry; () for a blank one or this node
        if not part.strip():
            continue
        address = static[0] if static else parse_host(part)
        if not is_dns_name(address.host):
            out.extend(static)
            continue
        name = address.host.lower().rstrip(".")
        out.append(DnsEntry(address.scheme, name, address.port, name.startswith("_")))
    return tuple(dict.fromkeys(out))


def peer_name(address: HostAddress) -> str:
    """How a peer is named in lists and logs: ``host:port``."""
    return address.netloc


def local_view(scheduler: Scheduler, store: Store, *, name: str = "", fallback: bool = False) -> NodeView:
    """This node as :class:`NodeView`: its own ``/llmman/node`` document, read as a peer reads it."""
    view = parse_node(LOCAL, "", node_document(scheduler, store, name=name, fallback=fallback, max_queue=0))
    assert view is not None  # our own document always parses
    return view


def jittered(interval: float, rng: random.Random) -> float:
    """One refresh wait: ``interval`` times a factor drawn uniformly from [1 - JITTER, 1 + JITTER)."""
    return interval * (1.0 + JITTER * (2.0 * rng.random() - 1.0))


@dataclass(frozen=True)
class Sighting:
    """One good answer of a peer's ``/llmman/node``.

    Attributes:
        view: the document as :class:`NodeView`.
        version: the llmman version the peer reported; empty from an older node.
        at: this node's monotonic clock when the fetch was sent (its age is "last seen").
        mark: the forward counter when the fetch was sent: forwards numbered above it started after.
        arrived: the clock when the answer arrived (how fresh it is: a slow peer's answer is news).
    """

    view: NodeView
    version: str
    at: float
    mark: int
    arrived: float = 0.0


@dataclass(frozen=True)
class PeerState:
    """A configured peer as ``/llmman/pool`` shows it.

    Attributes:
        address: the peer's address.
        seen: its last good answer, or None when it never answered.
        age: seconds since ``seen`` was fetched (None with it).
        down: why it is left out now, or None when it is up.
        forwarded: requests this node has open on it now.
        unresponsive: it is down because it did not answer in time, not dead: what it was last seen
            holding is still its (:meth:`Peers.holding`).
    """

    address: HostAddress
    seen: Sighting | None
    age: float | None
    down: str | None
    forwarded: int
    unresponsive: bool = False


@dataclass(frozen=True)
class Held:
    """An unresponsive peer last seen holding a model (:meth:`Peers.holding`).

    Attributes:
        address: the peer.
        loaded: it had the model loaded (else stored).
        age: seconds since that sighting was fetched.
    """

    address: HostAddress
    loaded: bool
    age: float


Sleep = Callable[[float], Awaitable[None]]


class Peers:
    """The peers of this node and what is known about their health and state.

    Args:
        session: the aiohttp session for peer traffic (TLS settings included).
        peers: the parsed ``aggregation.peers``.
        api_key: the peer key sent as ``Authorization: Bearer``; empty = none.
        timeout: seconds a probe waits for a peer; retry: seconds between re-probes of a down peer.
        loaded_ttl: seconds a model seen loaded on a peer is forwarded there without a new probe.
        refresh: seconds between background fetches of each peer (``aggregation.refresh``); 0 = none.
        clock, rng, sleep: monotonic seconds, the jitter's random source and the wait between
            refreshes (tests pass their own).
        discovery: the DNS names among the peers, followed from :meth:`start` (None: the list is static).
        node_id: this node's id in ``/llmman/node`` documents (:data:`.source.NODE_ID`): a peer answering
            with it is this node and is dropped; empty = not checked.
    """

    def __init__(self, session: aiohttp.ClientSession, peers: tuple[HostAddress, ...], *,
                 api_key: str = "", timeout: float = PROBE_TIMEOUT_S, retry: float = RETRY_S,
                 loaded_ttl: float = LOADED_TTL_S, refresh: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 sleep: Sleep = asyncio.sleep, discovery: Discovery | None = None,
                 node_id: str = "") -> None:
        self.session = session
        self.addresses = peers  # the peers now: replaced as a whole by update()
        self._names = {peer_name(a) for a in peers}
        self.discovery = discovery
        self.node_id = node_id
        self._itself: set[str] = set()  # peer names whose document carried our node id
        self._ids: dict[str, str] = {}  # peer name -> the node id its last document carried
        self._same: dict[str, str] = {}  # peer name -> the peer it is too (the same node id): left out
        self.api_key = api_key
        self.timeout = timeout
        self.retry = retry
        self.refresh = refresh
        self.clock = clock
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._down: dict[str, str] = {}  # peer name -> why
        self._slow: set[str] = set()  # the down peers that are unresponsive, not dead (timed out)
        self._timed_out: set[str] = set()  # peers whose last request from get_json timed out
        self._waiting: dict[str, str] = {}  # never answered and refused: asked by every decision
        self._retry_task: asyncio.Task[None] | None = None
        self._probing: asyncio.Future[list[NodeView]] | None = None
        self._probe_mark = 0  # the forward counter when the round in flight started
        self.recent = RecentLoaded(loaded_ttl)
        self._events = itertools.count(1)  # orders forward starts against fetches (cluster/optimistic.py)
        self._mark = 0  # the last number handed out
        self._forwarding: dict[tuple[str, str], set[int]] = {}  # (peer, reference lower-cased) -> starts
        self._seen: dict[str, Sighting] = {}  # peer name -> its last good answer
        self._fetching: dict[str, asyncio.Task[NodeView | None]] = {}  # peer name -> fetch in flight
        self._watchers: dict[str, asyncio.Task[None]] = {}  # peer name -> its refresh
        self._started = False
        self.probe_rounds = 0  # synchronous probe rounds made (LLMMAN_DEBUG logs each)

    def __bool__(self) -> bool:
        return bool(self.addresses)

    def headers(self) -> dict[str, str]:
        """What every request to a peer carries: the hop mark and the peer key."""
        out = {HOP: "1"}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out

    def server_name(self, address: HostAddress) -> str | None:
        """The name an ``https://`` peer found by DNS is verified as (its TLS ``server_hostname``), or None
        for a peer named by its own address (see :class:`.discovery.ServerNames`)."""
        if self.discovery is None or address.scheme != "https":
            return None
        return self.discovery.names.name_of(address.host, address.port)

    def up(self) -> list[HostAddress]:
        """The peers not remembered as down."""
        return [a for a in self.addresses if peer_name(a) not in self._down]

    def update(self, addresses: Iterable[HostAddress]) -> None:
        """The peer set is now ``addresses`` (this node's own left out): a new peer gets its refresh
        (once started); a removed one has its refresh stopped and everything known of it dropped."""
        addresses = tuple(addresses)
        offered = {peer_name(a) for a in addresses}
        for name, twin in list(self._same.items()):
            if twin not in offered:  # the address it was kept out for is gone: it is that node now
                del self._same[name]
        new = tuple(dict.fromkeys(a for a in addresses
                                  if peer_name(a) not in self._itself and peer_name(a) not in self._same))
        names = {peer_name(a) for a in new}
        gone = [a for a in self.addresses if peer_name(a) not in names]
        came = [a for a in new if peer_name(a) not in self._names]
        self.addresses, self._names = new, names
        for address in gone:
            self._forget(address)
        if self._started and self.refresh > 0:
            for address in came:
                self._watchers[peer_name(address)] = asyncio.create_task(self._watch(address))
        if gone or came:
            log.info("aggregation peers now %s%s%s", ", ".join(peer_name(a) for a in new) or "none",
                     "; added " + ", ".join(peer_name(a) for a in came) if came else "",
                     "; removed " + ", ".join(peer_name(a) for a in gone) if gone else "")

    def _forget(self, address: HostAddress) -> None:
        """Stop refreshing ``address`` and drop what is known of it (a fetch in flight is left to end:
        requests may be waiting on it; its answer is not kept)."""
        name = peer_name(address)
        watcher = self._watchers.pop(name, None)
        if watcher is not None:
            watcher.cancel()
        self._seen.pop(name, None)
        self._ids.pop(name, None)
        self._down.pop(name, None)
        self._slow.discard(name)
        self._timed_out.discard(name)
        self._waiting.pop(name, None)
        self.recent.forget_peer(address)

    def _itself_at(self, address: HostAddress) -> None:
        """``address`` answered with this node's id: it is this node, dropped now and kept out."""
        name = peer_name(address)
        if name not in self._itself:
            log.info("aggregation.peers: %s is this node itself (its node id); left out", name)
        self._itself.add(name)
        self.update(self.addresses)

    def _same_as(self, address: HostAddress, twin: str) -> None:
        """``address`` answered with the node id of peer ``twin``: the same node at another address (a
        node bound to every address; a dual-stack pod), dropped while ``twin`` is in the set."""
        name = peer_name(address)
        if name not in self._same:
            log.info("aggregation.peers: %s is %s again (the same node id); left out", name, twin)
        self._same[name] = twin
        self.update(self.addresses)

    def mark_down(self, address: HostAddress, why: str, *, slow: bool | None = None) -> None:
        """Skip ``address`` until a background re-probe sees it answer again (a peer no longer in the
        set is ignored).

        Args:
            slow: it did not answer in time (unresponsive: what it was seen holding is kept) rather
                than dead; None = judged by its last probe (:meth:`get_json` timing out).
        """
        name = peer_name(address)
        self.recent.forget_peer(address)
        if name not in self._names:
            return
        slow = name in self._timed_out if slow is None else slow
        if name not in self._down or slow != (name in self._slow):
            if slow:
                seen = self._seen.get(name)
                age = "never seen" if seen is None else f"last seen {self.clock() - seen.at:.1f} s ago"
                log.info("peer %s left out: %s; not answering in time, so taken for busy, not dead "
                         "(what it holds is kept: %s)", name, why, age)
            else:
                log.info("peer %s left out: %s", name, why)
        if slow:
            self._slow.add(name)
        else:
            self._slow.discard(name)
        self._down[name] = why
        if self._retry_task is None or self._retry_task.done():
            self._retry_task = asyncio.create_task(self._reprobe())

    async def get_json(self, address: HostAddress, path: str) -> object:
        """GET ``path`` on a peer with the peer headers, within the probe timeout: its JSON answer, of at
        most :data:`PEER_DOCUMENT_MAX` bytes and nested at most 1024 deep (orjson's limit), so a peer
        cannot exhaust this node's memory or stack with what it sends.

        Raises:
            OSError, aiohttp.ClientError, TimeoutError, ValueError: the peer failed in some way.
        """
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        name = peer_name(address)
        try:
            async with self.session.get(address.client_url() + path, headers=self.headers(),
                                        timeout=timeout) as response:
                if response.status != 200:
                    raise ValueError(f"{path} answered {response.status}")
                doc = orjson.loads(await read_capped(response, PEER_DOCUMENT_MAX))
        except TimeoutError:
            self._timed_out.add(name)
            raise
        except _FAILURES:  # it answered, wrongly, or the connection failed: no longer "timed out"
            self._timed_out.discard(name)
            raise
        self._timed_out.discard(name)
        return doc

    def _next_mark(self) -> int:
        self._mark = next(self._events)
        return self._mark

    async def _read(self, address: HostAddress) -> NodeView:
        """Fetch the peer's ``/llmman/node`` and keep it as its sighting.

        Raises:
            OSError, aiohttp.ClientError, TimeoutError, ValueError: the peer failed in some way.
        """
        name = peer_name(address)
        at, mark = self.clock(), self._next_mark()
        doc = await self.get_json(address, "/llmman/node")
        view = parse_node(name, address.client_url(), doc)
        if view is None:
            raise ValueError("not a node document")
        if self.node_id and isinstance(doc, dict) and doc.get("id") == self.node_id:
            self._itself_at(address)
            raise ValueError("this node itself")
        if name not in self._names:  # removed from the set while the fetch was out
            raise ValueError("no longer a peer")
        node = doc.get("id") if isinstance(doc, dict) else None
        if isinstance(node, str) and node:
            twin = next((n for n, i in self._ids.items() if i == node and n != name and n in self._names),
                        None)
            if twin is not None:
                self._same_as(address, twin)
                raise ValueError(f"the same node as {twin}")
            self._ids[name] = node
        if self._waiting.pop(name, None) is not None:
            log.info("peer %s is up", name)
        version = doc.get("version") if isinstance(doc, dict) else None
        self._seen[name] = Sighting(view, version if isinstance(version, str) else "", at, mark,
                                    self.clock())
        return view

    async def _fetch_one(self, address: HostAddress) -> NodeView | None:
        """One fetch of an up peer; a failure is logged and handled by :meth:`failed`."""
        try:
            return await self._read(address)
        except _FAILURES as exc:
            why = str(exc) or type(exc).__name__
            log.debug("placement: skipping peer %s: %s", peer_name(address), why)
            self.failed(address, exc)
            return None

    def failed(self, address: HostAddress, exc: BaseException) -> None:
        """``address`` failed a request with ``exc``: waiting when it has never answered and refused the
        connection, else down (:meth:`mark_down`)."""
        name = peer_name(address)
        why = str(exc) or type(exc).__name__
        if name not in self._names:
            return
        if refused(exc) and name not in self._seen and name not in self._down:
            if name not in self._waiting:
                log.info("peer %s is not up yet (%s): asked again by each decision until it answers",
                         name, why)
            self._waiting[name] = why
            return
        self._waiting.pop(name, None)
        self.mark_down(address, why, slow=timed_out(exc))

    async def _probe_one(self, address: HostAddress) -> NodeView | None:
        """The peer's state now, joining a fetch of it already in flight."""
        name = peer_name(address)
        fetch = self._fetching.get(name)
        if fetch is None or fetch.done():
            fetch = asyncio.create_task(self._fetch_one(address))
            self._fetching[name] = fetch
            fetch.add_done_callback(functools.partial(self._fetched, name))
        return await asyncio.shield(fetch)

    def _fetched(self, name: str, fetch: asyncio.Task[NodeView | None]) -> None:
        """A fetch ended: forget it (a DNS set whose addresses keep changing would otherwise keep one task
        per name ever seen), unless a newer fetch of that peer has taken its place."""
        if self._fetching.get(name) is fetch:
            del self._fetching[name]

    @contextlib.contextmanager
    def forwarding(self, address: HostAddress, ref: str) -> Iterator[None]:
        """Count one request forwarded to ``address`` for model ``ref`` while it runs: the views of
        :meth:`current` fetched before it started add it (optimistic accounting, :mod:`.optimistic`)."""
        key = (peer_name(address), ref.lower())
        start = self._next_mark()
        self._forwarding.setdefault(key, set()).add(start)
        try:
            yield
        finally:
            starts = self._forwarding[key]
            starts.discard(start)
            if not starts:
                del self._forwarding[key]

    def forwarded(self, address: HostAddress, ref: str) -> int:
        """Requests this node has open on ``address`` for ``ref`` now."""
        return len(self._forwarding.get((peer_name(address), ref.lower()), ()))

    def forwarded_since(self, name: str, mark: int) -> dict[str, int]:
        """Reference -> this node's forwards to peer ``name`` started after ``mark`` and still open."""
        out: dict[str, int] = {}
        for (peer, ref), starts in self._forwarding.items():
            if peer == name and (n := sum(1 for s in starts if s > mark)):
                out[ref] = n
        return out

    def _fresh(self) -> list[Sighting] | None:
        """The sightings of every up peer when each arrived at most STALE_AFTER refresh intervals ago
        (plus the probe timeout while the next fetch of it is in flight: a peer slow to answer, up to
        that timeout, must not make every decision wait for it), else None (also when the background
        refresh is off, or a peer is not up yet)."""
        if self.refresh <= 0 or self._waiting:
            return None
        now, limit = self.clock(), STALE_AFTER * self.refresh
        out = []
        for address in self.up():
            name = peer_name(address)
            seen, fetch = self._seen.get(name), self._fetching.get(name)
            grace = self.timeout if fetch is not None and not fetch.done() else 0.0
            if seen is None or now - seen.arrived > limit + grace:
                return None
            out.append(seen)
        return out

    def _mark_of(self, view: NodeView) -> int:
        """The forward counter when ``view`` was fetched: its sighting's, else the probe round's."""
        seen = self._seen.get(view.name)
        return seen.mark if seen is not None and seen.view is view else self._probe_mark

    async def current(self, *, probe: bool = False) -> list[NodeView]:
        """The up peers' views to decide on, each with the forwards this node started since it was
        fetched (:mod:`.optimistic`): the background sightings when fresh, else one probe round.

        Args:
            probe: make the probe round whatever the sightings' age (a decision that must not rest on
                figures up to a few refresh intervals old, e.g. where an unload goes).
        """
        fresh = None if probe else self._fresh()
        if fresh is not None:
            pairs = [(s.view, s.mark) for s in fresh]
        else:
            views = await self.probe()
            pairs = [(v, self._mark_of(v)) for v in views if v.name in self._names]  # not one removed since
        sizes: dict[str, int] = {}
        for view, _ in pairs:
            for ref, size in view.stored.items():
                sizes.setdefault(ref.lower(), size)
        return [add_forwards(view, self.forwarded_since(view.name, mark), sizes) for view, mark in pairs]

    async def probe(self) -> list[NodeView]:
        """Every peer not known to be down, asked at once; the ones that answered in time. A call made
        while another is in flight waits for that one's answer (one fan-out serves a burst)."""
        if self._probing is None or self._probing.done():
            self._probe_mark = self._mark
            self._probing = asyncio.ensure_future(self._probe_all())
        return list(await asyncio.shield(self._probing))

    async def _probe_all(self) -> list[NodeView]:
        up = self.up()
        self.probe_rounds += 1
        log.debug("probe round %d: %d peer(s)", self.probe_rounds, len(up))
        views = await asyncio.gather(*(self._probe_one(a) for a in up))
        return [v for v in views if v is not None]

    async def gather(self, path: str) -> list[tuple[HostAddress, Any]]:
        """GET ``path`` on every peer not known to be down, at once; ``(peer, document)`` of those
        that answered 200 with JSON in time (the others are marked down)."""
        async def one(address: HostAddress) -> tuple[HostAddress, Any] | None:
            try:
                return address, await self.get_json(address, path)
            except _FAILURES as exc:
                self.failed(address, exc)
                return None

        found = await asyncio.gather(*(one(a) for a in self.up()))
        return [f for f in found if f is not None]

    def holding(self, ref: str) -> list[Held]:
        """The unresponsive peers (down because they did not answer in time, not dead) whose last
        sighting has model ``ref`` loaded or stored, loaded first, then the most recently seen."""
        out = []
        now = self.clock()
        for address in self.addresses:
            name = peer_name(address)
            seen = self._seen.get(name)
            if name not in self._slow or seen is None:
                continue
            loaded = seen.view.has_loaded(ref)
            if loaded or seen.view.has_stored(ref):
                out.append(Held(address, loaded, max(0.0, now - seen.at)))
        return sorted(out, key=lambda h: (not h.loaded, h.age))

    def unresponsive(self, address: HostAddress) -> bool:
        """True when ``address`` is down because it did not answer in time (not dead)."""
        return peer_name(address) in self._slow

    def states(self) -> list[PeerState]:
        """Every configured peer, in order, as last known (no network)."""
        now = self.clock()
        out = []
        for address in self.addresses:
            name = peer_name(address)
            seen = self._seen.get(name)
            forwarded = sum(len(s) for (peer, _), s in self._forwarding.items() if peer == name)
            out.append(PeerState(address, seen, None if seen is None else max(0.0, now - seen.at),
                                 self._down.get(name, self._waiting.get(name)), forwarded,
                                 unresponsive=name in self._slow))
        return out

    def start(self) -> None:
        """Start the background refresh of every peer (none with ``refresh`` 0) and the following of the
        DNS names among them; call from the running event loop."""
        if self._started:
            return
        self._started = True
        if self.refresh > 0:
            self._watchers = {peer_name(a): asyncio.create_task(self._watch(a)) for a in self.addresses}
        if self.discovery is not None:
            self.discovery.start(self.update)

    async def _watch(self, address: HostAddress) -> None:
        """Fetch ``address`` now and then every jittered ``refresh`` while it is up (the re-probe
        brings it back when it is down)."""
        name = peer_name(address)
        while name in self._names:
            if name not in self._down:
                try:
                    await self._probe_one(address)
                except Exception:  # a bug must not stop the refresh of this peer for good
                    log.exception("refresh of peer %s failed", name)
            await self._sleep(jittered(self.refresh, self._rng))

    async def _reprobe(self) -> None:
        """Re-probe the down peers every ``retry`` seconds, all at once (one silent peer's timeout does
        not delay another's return), until none is left."""
        while self._down:
            await asyncio.sleep(self.retry)
            by_name: Mapping[str, HostAddress] = {peer_name(a): a for a in self.addresses}
            for name in [n for n in self._down if n not in by_name]:  # removed from the set meanwhile
                self._down.pop(name, None)
                self._slow.discard(name)
            await asyncio.gather(*(self._reprobe_one(by_name[name]) for name in list(self._down)))

    async def _reprobe_one(self, address: HostAddress) -> None:
        """One re-probe of the down peer ``address``: back when it answers; dead when it now refuses (an
        unresponsive peer that stops accepting), else left as it was."""
        name = peer_name(address)
        try:
            await self._read(address)
        except _FAILURES as exc:
            if name in self._down:  # a dead peer stays dead: its old sighting is not news
                still_slow = timed_out(exc) and name in self._slow
                self.mark_down(address, str(exc) or type(exc).__name__, slow=still_slow)
            return
        if self._down.pop(name, None) is not None:
            self._slow.discard(name)
            log.info("peer %s is back", name)

    async def close(self) -> None:
        """Stop the background refresh, re-probe and DNS following."""
        if self.discovery is not None:
            await self.discovery.close()
        tasks: list[asyncio.Task[Any]] = [*self._watchers.values(), *self._fetching.values()]
        if self._retry_task is not None:
            tasks.append(self._retry_task)
        self._watchers = {}
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
