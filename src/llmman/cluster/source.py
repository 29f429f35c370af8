"""Which peer a forwarded request's ``x-llmman-source`` may make this node copy from.

The header is client-controlled bytes, so a node only ever copies from one of its own configured
peers (it presents its peer key to whatever it copies from): a value naming anything else is ignored.
The forwarder, when it is the node storing the model, writes ``scheme://*:PORT`` (it cannot know the
address this node knows it by); ``*`` is matched against the configured peer with that port whose host
is the connection's source address. When nothing matches, the caller asks its peers which one stores
the model (:func:`storing_peer`). ``x-llmman-source-digest`` pins the manifest digest the forwarder
stores; a copy whose manifest differs fails.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import socket
from collections.abc import Callable, Iterable

from llmman.cluster.placement import NodeView
from llmman.config.table import HostAddress, parse_host
from llmman.errors import LlmmanError

SOURCE = "x-llmman-source"  # where the chosen node may copy the model from (a peer storing it)
SOURCE_DIGEST = "x-llmman-source-digest"  # the manifest digest that copy must have
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
NODE_ID = secrets.token_hex(8)  # this process among the pool's nodes: a peer document with it is this node


def normal_host(host: str) -> str:
    """``host`` lower-cased, brackets dropped, an IP address in its canonical text (``::1``)."""
    host = host.strip().strip("[]").lower()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def same_address(a: HostAddress, b: HostAddress) -> bool:
    """True when both name the same scheme, host (see :func:`normal_host`) and port (no DNS lookup)."""
    return (a.scheme, normal_host(a.host), a.port) == (b.scheme, normal_host(b.host), b.port)


def configured_source(value: str, client_host: str | None,
                      peers: Iterable[HostAddress]) -> HostAddress | None:
    """The configured peer ``value`` (an ``x-llmman-source`` header) names, or None.

    Args:
        value: ``[scheme://]host[:port]``; host ``*`` stands for ``client_host``.
        client_host: the TCP source address of the request (None when unknown).
        peers: this node's ``aggregation.peers``.
    """
    wildcard = "*" in value
    try:
        named = parse_host(value.replace("*", "wildcard.invalid") if wildcard else value)
    except LlmmanError:
        return None
    if not named.host or (wildcard and client_host is None):
        return None
    if wildcard:
        named = HostAddress(named.scheme, client_host or "", named.port)
    return next((p for p in peers if same_address(p, named)), None)


def source_digest(value: str | None) -> str:
    """``x-llmman-source-digest`` when it is a ``sha256:<64 hex>`` digest, else ``""`` (no pin)."""
    value = (value or "").strip().lower()
    return value if _DIGEST.fullmatch(value) else ""


def storing_peer(ref: str, views: Iterable[NodeView], peers: Iterable[HostAddress]) -> HostAddress | None:
    """The first configured peer whose probe lists ``ref`` as stored, or None."""
    by_name = {p.netloc: p for p in peers}
    return next((by_name[v.name] for v in views if v.has_stored(ref) and v.name in by_name), None)


def is_self(peer: HostAddress, own: HostAddress,
            local: Callable[[str], bool] | None = None) -> bool:
    """True when ``peer`` is this node's own listen address ``own`` (same host and port; a wildcard
    bind such as ``0.0.0.0`` also matches loopback, ``localhost`` and, on that port, any address of this
    machine: ``local``, by default :func:`is_local_address`)."""
    if peer.port != own.port:
        return False
    host, mine = normal_host(peer.host), normal_host(own.host)
    if host == mine:
        return True
    if mine in ("0.0.0.0", "::", ""):
        ip = _ip(host)
        if host == "localhost" or (ip is not None and ip.is_loopback):
            return True
        return ip is not None and (local or is_local_address)(host)
    return False


def is_local_address(host: str) -> bool:
    """True when ``host`` (an IP address) is an address of this machine: a socket can be bound to it.
    Nothing is sent; an address of another machine fails the bind at once."""
    ip = _ip(host)
    if ip is None or ip.is_unspecified or ip.is_multicast:
        return False
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((str(ip), 0))
    except OSError:
        return False
    return True


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
