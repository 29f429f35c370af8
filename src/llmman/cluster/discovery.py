"""Peers named by DNS: an ``aggregation.peers`` entry that is a name stands for every address it resolves to.

**Entries.** ``[scheme://]NAME[:PORT]`` whose NAME is a DNS name (not an IP literal, not ``localhost``) is
looked up (A and AAAA, at once) and each address is a peer at PORT (17434 without a scheme, 80/443 with
one). A NAME whose first label starts with ``_`` (``_llmman._tcp.llmman-peers.llmman.svc.cluster.local``)
is an SRV name: every target of its records is a peer at the record's port (the targets looked up as
above; priority and weight are ignored: every target is a member, placement decides the rest; a record
whose target is ``.`` or whose port is 0 names no service and is skipped).
IP literals and ``localhost`` stay one static peer each (:func:`llmman.cluster.peers.parse_peers`).

**Re-resolution.** Each name is looked up again after its answer's TTL, clamped to
:data:`MIN_TTL_S` .. :data:`MAX_TTL_S` (the smallest TTL of the records used; an SRV name's includes its
targets'). A lookup that *fails* (timeout, SERVFAIL, REFUSED, no server answers) keeps the name's last
good set, is logged once until it succeeds again, and is retried after :data:`RETRY_S`. An answer that
says the name has no address (NXDOMAIN, or no records: what a Kubernetes headless Service with no ready
pod gives) empties the name's set, and it is asked again after :data:`RETRY_S`.

**Which resolver.** ``aggregation.dns_server`` (``HOST[:PORT]``, port 53 by default) sends every lookup to
that server alone. Empty, the system's resolver configuration (``/etc/resolv.conf``, its search domains
included) is used, and a name DNS does not resolve is then given to the system's ``getaddrinfo`` (the hosts
file, mDNS), whose answer carries no TTL and is kept :data:`HOSTS_TTL_S`, so a name from ``/etc/hosts``
still works as before.

**TLS.** An ``https://`` name resolved to addresses is still verified as that name: :class:`ServerNames`,
a middleware of the peer session, sends each request to such an address with the name as TLS
``server_hostname`` and ``Host`` header (an SRV target's own name for SRV entries).

**Itself.** The addresses that are this node (:func:`llmman.cluster.source.is_self`: its own address and
port, or any address of this machine on its port when it listens on a wildcard; the addresses of its
``LLMMAN_HOST`` when that is a name) are left out. An address found twice (two names, a name and a static
entry, ``[0:0::1]`` and ``::1``) is one peer, the first entry's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import dns.asyncresolver
import dns.exception
import dns.rdatatype
import dns.resolver

from llmman.cluster.source import is_self, normal_host
from llmman.config.table import HostAddress
from llmman.errors import ConfigError

log = logging.getLogger("llmman.cluster")

MIN_TTL_S = 1.0  # a TTL of 0 (Consul's default) is asked again after this
MAX_TTL_S = 300.0  # a long TTL (a round-robin record of an hour) is asked again after this
RETRY_S = 5.0  # after a failed lookup, or one that found no address
HOSTS_TTL_S = 30.0  # an answer of getaddrinfo (hosts file, mDNS) has no TTL of its own
LOOKUP_TIMEOUT_S = 3.0  # one lookup, all its queries and retries included
DNS_PORT = 53
LOG_ADDRESSES = 8  # addresses of a set a log line names; the rest are counted


@dataclass(frozen=True)
class DnsEntry:
    """A peer entry whose host is a DNS name.

    Attributes:
        scheme: ``http`` or ``https``, as written (``http`` without one).
        name: the name, lower-cased, without a trailing dot.
        port: the entry's port (the default of the scheme without one); an SRV entry's records give theirs.
        srv: the name is an SRV name (its first label starts with ``_``).
    """

    scheme: str
    name: str
    port: int
    srv: bool

    def __str__(self) -> str:
        return self.name if self.srv else f"{self.name}:{self.port}"


Entry = HostAddress | DnsEntry


@dataclass(frozen=True)
class Found:
    """One address a lookup found: a peer at ``host:port``, verified as ``name`` under TLS."""

    host: str
    port: int
    name: str


@dataclass(frozen=True)
class Answer:
    """What one lookup of an entry found (possibly nothing) and the TTL its records carry (None: none)."""

    found: tuple[Found, ...]
    ttl: float | None


class LookupFailed(Exception):
    """No answer could be had (timeout, SERVFAIL, REFUSED, no server): not the same as "no address"."""


class Lookup(Protocol):
    """Something that looks an entry up: :class:`DnsLookup`, or a test's table."""

    async def __call__(self, entry: DnsEntry) -> Answer:
        """The entry's addresses now.

        Raises:
            LookupFailed: no answer could be had.
        """
        ...


def is_dns_name(host: str) -> bool:
    """True for a host that is looked up in DNS: not an IP literal, not ``localhost``."""
    host = normal_host(host).rstrip(".")
    if not host or host == "localhost":
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


def clamp_ttl(ttl: float | None) -> float:
    """Seconds until a name is looked up again: its TTL within ``MIN_TTL_S .. MAX_TTL_S``."""
    if ttl is None:
        return RETRY_S
    return min(MAX_TTL_S, max(MIN_TTL_S, float(ttl)))


@dataclass(frozen=True)
class EntrySet:
    """What one DNS entry stands for now.

    Attributes:
        found: its addresses (sorted: a round-robin answer's order changes, the set does not).
        wait: seconds until it is looked up again.
        failing: why the last lookup failed (the set is the last good one), or None.
    """

    found: tuple[Found, ...] = ()
    wait: float = 0.0
    failing: str | None = None


def _order(found: Found) -> tuple[int, int, int, str]:
    ip = ipaddress.ip_address(found.host)
    return ip.version, int(ip), found.port, found.name


def next_set(previous: EntrySet | None, outcome: Answer | LookupFailed) -> EntrySet:
    """The entry's set after a lookup: the answer's addresses, to be asked again after its clamped TTL
    (:data:`RETRY_S` when it found none); a failure keeps the previous set and retries after
    :data:`RETRY_S`."""
    if isinstance(outcome, LookupFailed):
        kept = previous.found if previous is not None else ()
        return EntrySet(kept, RETRY_S, str(outcome) or type(outcome).__name__)
    found = tuple(sorted(set(outcome.found), key=_order))
    return EntrySet(found, clamp_ttl(outcome.ttl) if found else RETRY_S)


def as_address(entry: DnsEntry, found: Found) -> HostAddress:
    """The peer address ``found`` stands for under ``entry``."""
    return HostAddress(entry.scheme, found.host, found.port)


def dns_server(text: str) -> tuple[str, int] | None:
    """``aggregation.dns_server`` (``HOST[:PORT]``, IPv6 in brackets, port 53 by default) as the server's
    IP address and port; None when empty (the system's resolver). A host name is looked up once, here.

    Raises:
        ConfigError: it does not parse, or its name resolves to nothing.
    """
    text = text.strip()
    if not text:
        return None
    host, port = text, str(DNS_PORT)
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port = text.split(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"aggregation.dns_server: {text!r} is not HOST[:PORT]")
    if host.lower() == "localhost":
        host = "127.0.0.1"
    elif is_dns_name(host):
        try:
            host = str(socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)[0][4][0])
        except OSError as exc:
            raise ConfigError(f"aggregation.dns_server: {text!r} does not resolve: {exc}") from None
    return normal_host(host), int(port)


class DnsLookup:
    """Looks entries up with dnspython's asyncio resolver (no cache of its own: each lookup asks).

    Args:
        server: ``aggregation.dns_server``; empty = the system's resolver, with the ``getaddrinfo``
            fallback for names DNS does not know.
        timeout: seconds one lookup may take.
    """

    def __init__(self, server: str = "", timeout: float = LOOKUP_TIMEOUT_S) -> None:
        where = dns_server(server)
        self.system = where is None
        self._resolver: dns.asyncresolver.Resolver | None
        if where is None:
            try:
                self._resolver = dns.asyncresolver.Resolver()
            except dns.resolver.NoResolverConfiguration:
                self._resolver = None  # no /etc/resolv.conf: getaddrinfo alone
        else:
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._resolver.nameservers = [where[0]]
            self._resolver.port = where[1]
        if self._resolver is not None:
            self._resolver.lifetime = timeout
            self._resolver.cache = None

    async def __call__(self, entry: DnsEntry) -> Answer:
        """The addresses of ``entry`` now (see the module docstring).

        Raises:
            LookupFailed: no answer could be had.
        """
        if not entry.srv:
            return await self._addresses(entry.name, entry.port)
        records, ttl = await self._query(entry.name, dns.rdatatype.SRV)
        targets = dict.fromkeys((str(r.target).rstrip(".").lower(), int(r.port)) for r in records
                                if str(r.target) != "." and int(r.port) > 0)  # port 0: no service there
        answers = await asyncio.gather(*(self._addresses(name, port) for name, port in targets))
        ttls = [t for t in (ttl, *(a.ttl for a in answers)) if t is not None]
        return Answer(tuple(f for a in answers for f in a.found), min(ttls) if ttls else None)

    async def _addresses(self, name: str, port: int) -> Answer:
        """``name``'s A and AAAA addresses at ``port``; the smallest TTL of the two.

        One type failing does not lose the other's records: a server that answers A but refuses AAAA
        (dnsmasq without ``--local``, some home routers) still gives the IPv4 peers. Only when neither
        type gave a record and one failed is the lookup a failure (the last good set is kept).
        """
        failed: LookupFailed | None = None
        found: list[Found] = []
        ttls: list[float] = []
        if self._resolver is not None:
            both = await asyncio.gather(self._query(name, dns.rdatatype.A),
                                        self._query(name, dns.rdatatype.AAAA), return_exceptions=True)
            for outcome in both:
                if isinstance(outcome, LookupFailed):
                    failed = failed or outcome
                    continue
                if isinstance(outcome, BaseException):
                    raise outcome
                records, ttl = outcome
                found += [Found(normal_host(r.address), port, name) for r in records]
                ttls += [ttl] if ttl is not None and records else []
        if found:
            return Answer(tuple(found), min(ttls) if ttls else None)
        if self.system:
            hosts = await self._getaddrinfo(name, port)
            if hosts:
                return Answer(hosts, HOSTS_TTL_S)
        if failed is not None:
            raise failed
        return Answer((), None)

    async def _query(self, name: str, rdtype: dns.rdatatype.RdataType) -> tuple[list[Any], float | None]:
        """The records of one type (none for NXDOMAIN or no answer) and their TTL.

        Raises:
            LookupFailed: the query got no answer.
        """
        assert self._resolver is not None
        try:
            answer = await self._resolver.resolve(name, rdtype, search=True, raise_on_no_answer=False)
        except dns.resolver.NXDOMAIN:
            return [], None
        except dns.exception.DNSException as exc:
            raise LookupFailed(f"{dns.rdatatype.to_text(rdtype)} {name}: {exc}") from None
        if answer.rrset is None:
            return [], None
        return list(answer.rrset), float(answer.rrset.ttl)

    @staticmethod
    async def _getaddrinfo(name: str, port: int) -> tuple[Found, ...]:
        """``name`` as the system resolves it (hosts file, mDNS); () when it does not."""
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except OSError:
            return ()
        return tuple(dict.fromkeys(Found(normal_host(str(info[4][0])), port, name) for info in infos))


class ServerNames:
    """The TLS names of ``https://`` peers known by address: a middleware of the peer session that gives
    a request to such an address the name as TLS ``server_hostname`` (the certificate is verified
    against it) and as ``Host``."""

    def __init__(self) -> None:
        self._names: dict[tuple[str, int], str] = {}

    def set(self, names: Mapping[tuple[str, int], str]) -> None:
        """``(host, port) -> name`` for every ``https://`` peer found by DNS now."""
        self._names = dict(names)

    def name_of(self, host: str, port: int) -> str | None:
        """The name the peer at ``host:port`` is verified as, or None (a peer named by its address)."""
        return self._names.get((normal_host(host), port))

    async def __call__(self, request: aiohttp.ClientRequest,
                       handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        url = request.url
        if url.scheme == "https" and url.host is not None and url.port is not None:
            name = self.name_of(url.host, url.port)
            if name is not None:
                request.server_hostname = name
                request.headers["Host"] = name if url.port == 443 else f"{name}:{url.port}"
        return await handler(request)


Sleep = Callable[[float], Awaitable[None]]
OnChange = Callable[[tuple[HostAddress, ...]], None]


@dataclass
class Discovery:
    """Follows the DNS entries of ``aggregation.peers`` and says when the peer set changes.

    Args:
        entries: every entry, in order (:func:`llmman.cluster.peers.parse_entries`); the static ones are
            kept as they are.
        lookup: how a DNS entry is looked up (:class:`DnsLookup`).
        own: this node's ``LLMMAN_HOST``: its own addresses are left out.
        names: the peer session's :class:`ServerNames`, kept up to date for ``https://`` entries.
        sleep: the wait between lookups (tests pass their own).
    """

    entries: tuple[Entry, ...]
    lookup: Lookup
    own: HostAddress | None = None
    names: ServerNames = field(default_factory=ServerNames)
    sleep: Sleep = asyncio.sleep
    _sets: dict[DnsEntry, EntrySet] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _own_hosts: frozenset[str] = frozenset()  # the addresses of ``own`` when its host is a name

    def __bool__(self) -> bool:
        return any(isinstance(e, DnsEntry) for e in self.entries)

    def addresses(self) -> tuple[HostAddress, ...]:
        """The peers now: every entry in order, a DNS entry as its current set, this node left out."""
        out: dict[tuple[str, str, int], HostAddress] = {}  # one peer per scheme, address and port
        for entry in self.entries:
            if isinstance(entry, HostAddress):
                out.setdefault(_key(entry), entry)
                continue
            for found in self._sets.get(entry, EntrySet()).found:
                address = as_address(entry, found)
                if not self.is_own(address):
                    out.setdefault(_key(address), address)
        return tuple(out.values())

    def is_own(self, address: HostAddress) -> bool:
        """True when ``address`` is this node (:func:`.source.is_self`, or one of the addresses its
        ``LLMMAN_HOST`` name resolves to, on its port)."""
        if self.own is None:
            return False
        return is_self(address, self.own) or (address.port == self.own.port
                                               and normal_host(address.host) in self._own_hosts)

    async def learn_own(self) -> None:
        """Look up this node's own ``LLMMAN_HOST`` when it is a name (once): its addresses are itself."""
        if self.own is None or not is_dns_name(self.own.host) or self._own_hosts:
            return
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(self.own.host, self.own.port,
                                                                 type=socket.SOCK_STREAM)
        except OSError:
            return
        self._own_hosts = frozenset(normal_host(str(info[4][0])) for info in infos)

    def set_of(self, entry: DnsEntry) -> EntrySet | None:
        """What ``entry`` stands for now (None before its first lookup)."""
        return self._sets.get(entry)

    async def refresh(self, entry: DnsEntry) -> bool:
        """Look ``entry`` up once and keep its new set; True when the set changed."""
        previous = self._sets.get(entry)
        try:
            outcome: Answer | LookupFailed = await self.lookup(entry)
        except LookupFailed as exc:
            outcome = exc
        now = next_set(previous, outcome)
        self._sets[entry] = now
        self._log(entry, previous, now)
        changed = previous is None or previous.found != now.found
        if changed:
            self.names.set({(f.host, f.port): f.name for e, s in self._sets.items() if e.scheme == "https"
                            for f in s.found})
        return changed

    def start(self, on_change: OnChange) -> None:
        """Follow every DNS entry (one task each), calling ``on_change`` with :meth:`addresses` whenever
        the set changes; call from the running event loop."""
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._follow(e, on_change)) for e in self.entries
                           if isinstance(e, DnsEntry)]

    async def _follow(self, entry: DnsEntry, on_change: OnChange) -> None:
        await self.learn_own()
        while True:
            try:
                if await self.refresh(entry):
                    on_change(self.addresses())
                wait = self._sets[entry].wait
            except Exception:  # a bug must not stop following this name for good
                log.exception("aggregation.peers: following %s failed", entry)
                wait = RETRY_S
            await self.sleep(wait)

    async def close(self) -> None:
        """Stop following."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    @staticmethod
    def _log(entry: DnsEntry, previous: EntrySet | None, now: EntrySet) -> None:
        if now.failing is not None:
            if previous is None or previous.failing is None:
                log.warning("aggregation.peers: looking up %s failed (%s); keeping its %d address(es), "
                            "retried every %gs", entry, now.failing, len(now.found), RETRY_S)
            return
        if previous is not None and previous.failing is not None:
            log.info("aggregation.peers: %s resolves again", entry)
        if previous is None or previous.found != now.found:
            log.info("aggregation.peers: %s is %s (next lookup in %gs)", entry, _shown(now.found), now.wait)


def _shown(found: tuple[Found, ...]) -> str:
    """A set for the log: its first :data:`LOG_ADDRESSES` addresses and how many more (a name of hundreds of
    addresses that changes every second must not write kilobytes a second)."""
    if not found:
        return "no address"
    shown = ", ".join(f"{_bracket(f.host)}:{f.port}" for f in found[:LOG_ADDRESSES])
    more = len(found) - LOG_ADDRESSES
    return f"{len(found)} addresses: {shown} and {more} more" if more > 0 else shown


def _key(address: HostAddress) -> tuple[str, str, int]:
    """What makes two peer addresses one peer: scheme, host in its canonical text, port."""
    return address.scheme, normal_host(address.host), address.port


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host
