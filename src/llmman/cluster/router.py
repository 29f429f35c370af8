"""Where one request runs: this node, or a peer (the placement decision, in the data path).

The pipeline (api/inference.py) asks :meth:`Router.decide` once per request and acts on the value it
gets back; this module owns every rule of that choice, and only here is it made:

* a request that came from a peer (``x-llmman-hop``) is this node's alone; its ``x-llmman-source``
  may name the peer to copy a missing model from, honoured only when it is one of this node's configured
  peers (:mod:`.source`); ``*`` there is the connection's source address, else the peer whose probe
  lists the model as stored;
* a node without peers, a model already loaded here, or a name that does not parse: served here;
* ``/api/show`` (:attr:`Intent.SHOW`) goes to a node storing the model; an unload (``keep_alive`` 0
  with nothing to generate, :attr:`Intent.UNLOAD`) to the node that has it loaded, else to one storing
  it (which answers ``unload`` as a single daemon storing it does);
* anything else is ranked by the three rules of docs/aggregation.md (:func:`.placement.rank`: loaded,
  else fits and stored, else the most room); a peer seen with the model loaded moments ago is tried
  without a new probe (:mod:`.recent`);
* when the chosen node lacks the model and another node stores it, the copy source goes with the
  decision: :class:`Local` ``source`` for this node, :class:`Target` ``source`` (a header) for a peer.

:class:`Forward` lists the peers to try in order; each that fails before its first byte is
:meth:`Router.failed` (marked down) and the next is tried, then :attr:`Forward.otherwise`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from llmman.cluster.copy import PullSource
from llmman.cluster.peers import Peers, local_view, peer_name
from llmman.cluster.placement import NodeView, model_size, rank
from llmman.cluster.source import configured_source, source_digest, storing_peer
from llmman.config.table import HostAddress
from llmman.errors import LlmmanError
from llmman.refs import parse_reference
from llmman.sched.scheduler import Scheduler
from llmman.store import Store

log = logging.getLogger("llmman.cluster")


class Intent(Enum):
    """What a request wants of its model, which decides where it may go."""

    INFER = "infer"  # generate, embed, count tokens: the model must be loaded somewhere
    UNLOAD = "unload"  # keep_alive 0 with nothing to generate: where it is loaded, never pulled
    SHOW = "show"  # describe it: where it is stored


@dataclass(frozen=True)
class Origin:
    """Where a request came from, as far as placement cares.

    Attributes:
        hop: it carries ``x-llmman-hop`` (a peer forwarded it).
        source: its ``x-llmman-source`` header, or None.
        digest: its ``x-llmman-source-digest`` header, or None.
        client_host: the TCP source address, or None.
    """

    hop: bool = False
    source: str | None = None
    digest: str | None = None
    client_host: str | None = None


@dataclass(frozen=True)
class Local:
    """Serve on this node; ``source`` is the peer to copy the model from when the store lacks it."""

    source: PullSource | None = None


@dataclass(frozen=True)
class Target:
    """A peer to forward to, and the copy source it is told about (``x-llmman-source``: a URL, or
    ``scheme://*:PORT`` for this node; ``digest`` pins the manifest)."""

    address: HostAddress
    source: str | None = None
    digest: str = ""

    @property
    def name(self) -> str:
        return peer_name(self.address)


@dataclass(frozen=True)
class Forward:
    """Forward to ``targets`` in order; when every one failed before answering, ``otherwise`` (None:
    the target came from the recent-loaded memory, so decide again with a fresh probe)."""

    targets: tuple[Target, ...]
    otherwise: Local | None


Decision = Local | Forward


class Router:
    """The placement decision of this node (see the module docstring).

    Args:
        peers: the aggregation's peers (None or empty: a node on its own).
        scheduler, store: this node's state, for its own view.
        own: this node's listen address (its scheme and port name it to a peer as ``scheme://*:PORT``).
        aliases: the ``[aliases]`` table, for reading model names.
    """

    def __init__(self, peers: Peers | None, scheduler: Scheduler, store: Store, own: HostAddress,
                 aliases: dict[str, str]) -> None:
        self.peers = peers
        self._scheduler = scheduler
        self._store = store
        self._own = own
        self._aliases = aliases

    def reference(self, name: str) -> str | None:
        """``name``'s full reference, or None when it does not parse."""
        try:
            return str(parse_reference(name, self._aliases))
        except LlmmanError:
            return None

    async def decide(self, name: str, intent: Intent, origin: Origin, *, fresh: bool = False,
                     tried: frozenset[str] = frozenset(), conversation: str | None = None) -> Decision:
        """Where the request for model ``name`` runs.

        Args:
            fresh: skip the recent-loaded memory.
            tried: nodes already tried for this request (``local`` and peer names): left out; when
                nothing else is left the answer is :class:`Local` (the caller knows local was tried).
            conversation: the request's conversation key (:mod:`llmman.protocol.conversation`), for
                affinity; None = none.
        """
        peers = self.peers
        if not peers:  # a node on its own: nothing to decide (and no name to read)
            return Local()
        ref = self.reference(name)
        if origin.hop:
            return await self._hop(origin, ref)
        if ref is None or self._loaded_here(ref):
            return Local()
        if intent is not Intent.INFER:
            peers.recent.forget(ref)
        elif not fresh and (seen := peers.recent.get(ref)) is not None and seen[0] in peers.up():
            log.debug("placement of %s: %s (loaded there, probed %.1f s ago)", ref, peer_name(seen[0]),
                      seen[1])
            return Forward((Target(seen[0]),), otherwise=None)
        nodes = [local_view(self._scheduler, self._store), *await peers.current()]
        candidates = [n for n in _candidates(intent, ref, nodes) if n.name not in tried]
        if not candidates:
            return Local()
        log.debug("placement of %s: %s (free/memory: %s)", ref, [n.name for n in candidates],
                  {n.name: f"{n.free}/{n.memory}" for n in nodes})
        if intent is Intent.INFER and candidates[0].has_loaded(ref) and not candidates[0].is_local:
            peers.recent.put(ref, self._address(candidates[0]))
        # Only a request that will load the model copies it (an unload or a show only looks).
        storer = next((n for n in nodes if n.has_stored(ref)), None) if intent is Intent.INFER else None
        targets: list[Target] = []
        for node in candidates:
            if node.is_local:
                local = Local(PullSource(self._address(storer), peers.api_key)
                              if storer is not None and not storer.is_local else None)
                return Forward(tuple(targets), local) if targets else local
            targets.append(self._target(node, storer, ref))
        return Forward(tuple(targets), Local())

    def failed(self, target: Target, why: str) -> None:
        """``target`` failed before answering: it is left out until it answers a probe again."""
        if self.peers is not None:
            self.peers.mark_down(target.address, why)

    def answered(self, name: str, status: int) -> None:
        """A forward was answered with ``status``: an error drops what the recent memory knows."""
        ref = self.reference(name)
        if status >= 400 and ref is not None and self.peers is not None:
            self.peers.recent.forget(ref)

    async def _hop(self, origin: Origin, ref: str | None) -> Local:
        """A forwarded request: served here, copying from the source it names when that is a peer."""
        peers = self.peers
        if not peers or origin.source is None:
            return Local()
        address = configured_source(origin.source, origin.client_host, peers.addresses)
        if address is None and "*" in origin.source and ref is not None \
                and self._store.find(parse_reference(ref)) is None:
            log.info("x-llmman-source %r names no configured peer: asking the peers which one stores %s",
                     origin.source, ref)
            address = storing_peer(ref, await peers.probe(), peers.addresses)
        if address is None:
            return Local()
        return Local(PullSource(address, peers.api_key, source_digest(origin.digest)))

    def _target(self, node: NodeView, storer: NodeView | None, ref: str) -> Target:
        """The peer ``node`` as a target, told where to copy ``ref`` from when it does not store it."""
        address = self._address(node)
        if storer is None or node.has_stored(ref):
            return Target(address)
        if not storer.is_local:
            return Target(address, storer.url)
        # The peer resolves "*" by our connection's source address (it knows us by another name).
        mine = self._store.find(parse_reference(ref))
        return Target(address, f"{self._own.scheme}://*:{self._own.port}", mine.digest if mine else "")

    def _loaded_here(self, ref: str) -> bool:
        """True when this node has ``ref`` loaded (or loading); cheaper than :func:`local_view`."""
        key = ref.lower()
        return any(snap.reference.lower() == key for snap in self._scheduler.snapshot())

    def _address(self, node: NodeView) -> HostAddress:
        assert self.peers is not None
        return next(a for a in self.peers.addresses if peer_name(a) == node.name)


def _candidates(intent: Intent, ref: str, nodes: list[NodeView]) -> list[NodeView]:
    """Where to try, in order: show and unload go where the model is; anything else by the rules."""
    if intent is Intent.SHOW:
        return [n for n in nodes if n.has_stored(ref)] or nodes[:1]
    if intent is Intent.UNLOAD:  # loaded nowhere: a node storing it answers as one daemon would (200)
        return [n for n in nodes if n.has_loaded(ref)] or [n for n in nodes if n.has_stored(ref)] or nodes[:1]
    return rank(ref, model_size(ref, nodes), nodes)
