"""Where one request runs: this node, or a peer (the placement decision, in the data path).

The pipeline (api/inference.py) asks :meth:`Router.decide` once per request and acts on the value it
gets back; this module owns every rule of that choice, and only here is it made:

* a request that came from a peer (``x-llmman-hop``) is this node's alone; its ``x-llmman-source``
  may name the peer to copy a missing model from, honoured only when it is one of this node's configured
  peers (:mod:`.source`); ``*`` there is the connection's source address, else the peer whose probe
  lists the model as stored;
* a node without peers, or a name that does not parse: served here;
* ``/api/show`` (:attr:`Intent.SHOW`) goes to a node storing the model; an unload (``keep_alive`` 0
  with nothing to generate, :attr:`Intent.UNLOAD`) to the node that has it loaded, else to one storing
  it (which answers ``unload`` as a single daemon storing it does); a model loaded here stays here; the
  pipeline also sends it to every other copy (:meth:`Router.copies_elsewhere`);
* anything else by :attr:`Policy.spread` (docs/aggregation.md#spreading-and-replicas):
  ``off`` — the three rules of the seed (:func:`.placement.rank_off`: loaded, else fits and stored, else
  the most room; a model loaded here is served here; a peer seen with the model loaded moments ago is
  tried without a new probe, :mod:`.recent`); ``loaded`` and ``replicas`` — over the loaded copies'
  slots (:func:`.placement.rank_spread`; a copy here with a spare slot is served here without looking at
  the peers), ``replicas`` placing another copy when every copy stayed saturated
  (:class:`.replicas.Saturation`), a conversation's next turn going where it went (:mod:`.affinity`);
  with every policy fallback nodes come after the others and draining nodes last;
* when the chosen node lacks the model and another node stores it, the copy source goes with the
  decision: :class:`Local` ``source`` for this node, :class:`Target` ``source`` (a header) for a peer.

:class:`Forward` lists the peers to try in order; each that fails before its first byte is
:meth:`Router.failed` (marked down) and the next is tried, then :attr:`Forward.otherwise`.

**Busy is not down** (docs/aggregation.md#busy-is-not-down): when no node that answers (this one
included) has the model loaded or stored, but a peer that stopped answering *in time* (unresponsive, not
dead: :meth:`.peers.Peers.holding`) was last seen holding it, the request is answered 503 with
``Retry-After`` (:func:`unresponsive_holder`), never sent where it would be a 404 or a pull. For the same
reason a forward to the peers holding a model this node lacks has no :attr:`Forward.otherwise`: when
they all fail, the decision is made again, and sees whether they are dead (then as before) or slow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import cast

from llmman.cluster.affinity import Affinity
from llmman.cluster.copy import PullSource
from llmman.cluster.peers import Held, Peers, local_view, peer_name
from llmman.cluster.placement import (
    LOCAL,
    OFF,
    REPLICAS,
    ModelLoad,
    NodeView,
    backlogged_everywhere,
    copies,
    model_size,
    rank_off,
    rank_spread,
    saturated_everywhere,
    slot_guess,
    usable_copy,
)
from llmman.cluster.replicas import LocalPending, Saturation
from llmman.cluster.source import configured_source, source_digest, storing_peer
from llmman.cluster.state import model_loads
from llmman.config.settings import Settings
from llmman.config.table import HostAddress
from llmman.errors import LlmmanError, ServiceUnavailable
from llmman.refs import parse_reference
from llmman.sched.scheduler import Scheduler
from llmman.store import Store, StoredModel

log = logging.getLogger("llmman.cluster")

#: The error code of a request for a model only an unresponsive peer holds (503, ``Retry-After``).
PEER_UNRESPONSIVE = "peer_unresponsive"


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


@dataclass(frozen=True)
class Policy:
    """How this node places requests (docs/aggregation.md#spreading-and-replicas).

    Attributes:
        spread: ``off`` (the seed's rules), ``loaded`` (spread over the loaded copies) or ``replicas``
            (also load another copy when every copy stays saturated).
        max_replicas: the most copies of one model ``replicas`` makes in the pool; 0 = one per node.
        replica_after: seconds every copy must stay saturated before another one loads.
        affinity: send a conversation's next turns where its last one went.
        affinity_ttl: seconds a conversation is remembered after its last turn (``server.keep_alive``).
        name: this node's name (``node.name``); fallback: this node is fallback-only (``node.fallback``).
        slots: the slots of a copy this node loads (``server.num_parallel``), for the requests placed on
            it before the scheduler shows it; 0 = unknown.
    """

    spread: str = REPLICAS
    max_replicas: int = 0
    replica_after: float = 2.0
    affinity: bool = True
    affinity_ttl: float = 300.0
    name: str = ""
    fallback: bool = False
    slots: int = 0

    @classmethod
    def of(cls, settings: Settings) -> Policy:
        """The policy the settings configure."""
        return cls(settings.spread, settings.max_replicas, settings.replica_after, settings.affinity,
                   settings.keep_alive, settings.node_name, settings.fallback, settings.num_parallel)


class Router:
    """The placement decision of this node (see the module docstring).

    Args:
        peers: the aggregation's peers (None or empty: a node on its own).
        scheduler, store: this node's state, for its own view.
        own: this node's listen address (its scheme and port name it to a peer as ``scheme://*:PORT``).
        aliases: the ``[aliases]`` table, for reading model names.
        policy: how requests are placed (:meth:`Policy.of` the settings).
        clock: monotonic seconds, for the saturation period, the affinity memory and the local
            placements not yet counted by the scheduler (tests pass a fake one).
    """

    def __init__(self, peers: Peers | None, scheduler: Scheduler, store: Store, own: HostAddress,
                 aliases: dict[str, str], *, policy: Policy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.peers = peers
        self.policy = policy or Policy()
        self._scheduler = scheduler
        self._store = store
        self._own = own
        self._aliases = aliases
        self._saturation = Saturation(clock)
        self._pending = LocalPending(clock=clock)
        self.affinity = Affinity(self.policy.affinity_ttl, clock=clock)

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
            fresh: skip the recent-loaded memory and the background views: ask the peers now (a
                decision made again after every target failed).
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
            if ref is not None and intent is Intent.INFER and self.policy.spread != OFF:
                self._pending.placed(ref, self._reported_busy(ref))
            return await self._hop(origin, ref)
        if ref is None:
            return Local()
        if intent is not Intent.INFER:
            if LOCAL not in tried and self._loaded_here(ref):
                return Local()
            peers.recent.forget(ref)
            # Where a model is loaded changes from one moment to the next: an unload asks the peers now.
            nodes = [self._local_view(ref), *await peers.current(probe=intent is Intent.UNLOAD or fresh)]
            candidates = _looking(intent, ref, nodes)
            _log_seed(ref, candidates, nodes, tried)
            return self._route(ref, intent, nodes, candidates, tried)
        if self.policy.spread == OFF:
            return await self._seed(ref, fresh, tried)
        return await self._spread(ref, fresh, tried, conversation)

    async def _seed(self, ref: str, fresh: bool, tried: frozenset[str]) -> Decision:
        """``spread = off``: loaded here is served here, a peer seen with it loaded is tried without a
        probe, else :func:`.placement.rank_off`."""
        peers = self.peers
        assert peers
        local = self._local_load(ref)
        if LOCAL not in tried and local is not None and not local.draining and not self._scheduler.draining:
            return Local()
        if not fresh and (seen := peers.recent.get(ref)) is not None and seen[0] in peers.up() \
                and peer_name(seen[0]) not in tried:
            log.debug("placement of %s: %s (loaded there, probed %.1f s ago)", ref, peer_name(seen[0]),
                      seen[1])
            return Forward((Target(seen[0]),), otherwise=None)
        nodes = [self._local_view(ref), *await peers.current(probe=fresh)]
        ranked = rank_off(ref, model_size(ref, nodes), nodes)
        _log_seed(ref, ranked, nodes, tried)
        decision = self._route(ref, Intent.INFER, nodes, ranked, tried)
        first = next((n for n in ranked if n.name not in tried), None)
        if first is not None and first.has_loaded(ref) and not first.is_local:
            peers.recent.put(ref, self._address(first))
        return decision

    async def _spread(self, ref: str, fresh: bool, tried: frozenset[str],
                      conversation: str | None) -> Decision:
        """``spread = loaded`` or ``replicas``: a spare slot here (and no conversation elsewhere) is
        served here without looking at the peers, else :func:`.placement.rank_spread` over every
        node, a conversation's node first while its copy is not saturated."""
        peers, policy = self.peers, self.policy
        assert peers
        affine = self.affinity.get(conversation) if conversation is not None and policy.affinity else None
        here = self._local_load(ref)
        if LOCAL not in tried and affine in (None, LOCAL) and not policy.fallback \
                and not self._scheduler.draining and here is not None and not here.draining and here.spare:
            self._saturation.observe(ref, False, policy.replica_after)  # a copy with room: not saturated
            return self._here(ref, conversation)
        nodes = [self._local_view(ref), *await peers.current(probe=fresh)]
        live = [n for n in nodes if n.name not in tried]  # a node tried for this request weighs nothing
        if not live:
            return Local()
        saturated = saturated_everywhere(ref, live)
        timed = self._saturation.held(ref, policy.replica_after) and saturated if tried \
            else self._saturation.observe(ref, saturated, policy.replica_after)
        replica = policy.spread == REPLICAS and (timed or backlogged_everywhere(ref, live)) \
            and (policy.max_replicas <= 0 or copies(ref, nodes) < policy.max_replicas)
        ranked = _affine_first(ref, affine, rank_spread(ref, model_size(ref, nodes), live,
                                                        fill=policy.spread == REPLICAS, replica=replica))
        first = ranked[0]
        log.debug("placement of %s: %s (spread %s%s; load: %s)", ref, [n.name for n in ranked], policy.spread,
                  ", another copy due" if replica and not first.has_loaded(ref) else "",
                  {n.name: _load_text(n, ref) for n in nodes})
        if conversation is not None and policy.affinity:
            self.affinity.put(conversation, first.name)
        if replica and not first.has_loaded(ref):
            self._saturation.restart(ref)
        if first.is_local:
            self._pending.placed(ref, self._reported_busy(ref))
        return self._route(ref, Intent.INFER, nodes, ranked, tried)

    def _route(self, ref: str, intent: Intent, nodes: list[NodeView], ranked: list[NodeView],
               tried: frozenset[str]) -> Decision:
        """The decision for ``ranked`` less ``tried``: the peers before this node as targets, each told
        where to copy the model from when it lacks it; this node (or, when it is not ranked, nothing
        left) as :attr:`Forward.otherwise`."""
        peers = self.peers
        assert peers
        holders = [n for n in nodes if _holds(n, ref)]
        if not holders:
            unresponsive_holder(ref, peers.holding(ref), peers.retry)
        candidates = [n for n in ranked if n.name not in tried]
        # Only a request that will load the model copies it (an unload or a show only looks).
        storer = next((n for n in nodes if n.has_stored(ref)), None) if intent is Intent.INFER else None
        targets: list[Target] = []
        for node in candidates:
            if node.is_local:
                break
            targets.append(self._target(node, storer, ref))
        here = any(n.is_local for n in candidates)
        local = Local(PullSource(self._address(storer), peers.api_key)
                      if storer is not None and not storer.is_local else None) if here else Local()
        if not targets:
            return local
        # This node lacks the model and the peers holding it are among the targets: when they all fail,
        # decide again (None) rather than copy or pull it here, for they may only be slow to answer.
        names = {t.name for t in targets}
        if all(not n.is_local for n in holders) and any(n.name in names for n in holders):
            return Forward(tuple(targets), None)
        return Forward(tuple(targets), local)

    def _here(self, ref: str, conversation: str | None) -> Local:
        """Served here from the copy loaded here: counted until the scheduler shows it, remembered for
        the conversation."""
        self._pending.placed(ref, self._reported_busy(ref))
        if conversation is not None and self.policy.affinity:
            self.affinity.put(conversation, LOCAL)
        return Local()

    def _local_load(self, ref: str) -> ModelLoad | None:
        """How busy this node's copy of ``ref`` is, the placements the scheduler does not show yet
        included (:class:`.replicas.LocalPending`; none under ``spread = off``): placements for a model
        the scheduler does not show at all are a copy loading, with ``Policy.slots``. None: no copy."""
        load = _load_in(model_loads(self._scheduler.snapshot()), ref)
        if self.policy.spread == OFF:
            return load
        busy = self._pending.busy(ref, 0 if load is None else load.busy)
        if load is None:
            return ModelLoad(self.policy.slots, 0, busy, loading=True) if busy else None
        if busy == load.busy:
            return load
        served = load.in_flight if load.loading else min(busy, load.slots or 1)
        return replace(load, in_flight=served, queued=busy - served)

    def _reported_busy(self, ref: str) -> int:
        """Requests on this node's copy of ``ref`` as the scheduler counts them (0 when not loaded)."""
        load = _load_in(model_loads(self._scheduler.snapshot()), ref)
        return 0 if load is None else load.busy

    def _local_view(self, ref: str) -> NodeView:
        """This node as its peers see it, with :meth:`_local_load` as the load of ``ref``; its store as
        far as ``ref`` goes (a decision reads nothing else of it, and listing a large store is slow)."""
        store = cast(Store, _OneModel(self._store, ref))
        view = local_view(self._scheduler, store, name=self.policy.name, fallback=self.policy.fallback)
        load = self._local_load(ref)
        if load is None:
            return view
        models = {r: m for r, m in view.models.items() if r.lower() != ref.lower()}
        models[ref] = load
        if view.has_loaded(ref):
            return replace(view, models=models)
        # A copy the placements made here are loading: its weights count as taken, as a peer's would.
        return replace(view, models=models, loaded={**view.loaded, ref: model_size(ref, [view])})

    async def copies_elsewhere(self, name: str) -> list[Target]:
        """Every peer that has model ``name`` loaded now (asked now, not from the background views): where
        a stop must go besides the node :meth:`decide` names, so that it drains the model wherever it is."""
        peers, ref = self.peers, self.reference(name)
        if not peers or ref is None:
            return []
        return [Target(self._address(n)) for n in await peers.current(probe=True) if n.has_loaded(ref)]

    def served(self, conversation: str | None, node: str) -> None:
        """``node`` (``local`` or a peer's name) answered a turn of ``conversation``: its next turns go
        there (the node a failover ended on, not the one first chosen)."""
        if conversation is not None and self.policy.affinity and self.policy.spread != OFF:
            self.affinity.put(conversation, node)

    def failed(self, target: Target, why: str) -> None:
        """``target`` failed before answering (or mid-answer): it is left out until it answers a probe
        again; unresponsive rather than dead when the silence check's own probe timed out
        (:meth:`.peers.Peers.mark_down`)."""
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


class _OneModel:
    """A store that lists one model (or none): what :func:`.state.node_document` needs of the store for
    a decision about that model."""

    def __init__(self, store: Store, ref: str) -> None:
        self._store = store
        self._ref = ref

    def list(self) -> list[StoredModel]:
        found = self._store.find(parse_reference(self._ref))
        return [] if found is None else [found]


def unresponsive_holder(ref: str, held: list[Held], retry: float) -> None:
    """The busy-is-not-down rule: raise when ``held`` (the unresponsive peers last seen holding
    ``ref``, :meth:`.peers.Peers.holding`) is not empty, for a decision no answering node can serve from
    its own store; ``retry`` (the re-probe interval) is the ``Retry-After``.

    Raises:
        ServiceUnavailable: 503 :data:`PEER_UNRESPONSIVE`, naming the peer and how long ago it was seen.
    """
    if not held:
        return
    first = held[0]
    how = "loaded" if first.loaded else "stored"
    log.debug("placement of %s: only %s holds it (%s, seen %.1f s ago) and it is not answering in time: 503",
              ref, peer_name(first.address), how, first.age)
    raise ServiceUnavailable(
        f"model '{ref}' is on peer {peer_name(first.address)} ({how} there {first.age:.0f} s ago), which is "
        "not answering in time (busy); try again shortly",
        code=PEER_UNRESPONSIVE, retry_after=max(1.0, retry))


def _holds(node: NodeView, ref: str) -> bool:
    return node.has_loaded(ref) or node.has_stored(ref)


def _looking(intent: Intent, ref: str, nodes: list[NodeView]) -> list[NodeView]:
    """Where a show or an unload goes, in order: show where the model is stored, unload where it is
    loaded (loaded nowhere: a node storing it answers as one daemon would, 200)."""
    if intent is Intent.SHOW:
        return [n for n in nodes if n.has_stored(ref)] or nodes[:1]
    return [n for n in nodes if n.has_loaded(ref)] or [n for n in nodes if n.has_stored(ref)] or nodes[:1]


def _affine_first(ref: str, affine: str | None, ranked: list[NodeView]) -> list[NodeView]:
    """``ranked`` with the conversation's node first while its copy takes requests and has a spare
    slot — or, when no copy has one, is not saturated; a fallback node only when the first choice is
    one too. A node that is gone (not ranked) or has unloaded the model loses its conversations."""
    node = next((n for n in ranked if n.name == affine), None) if affine is not None else None
    if node is None or node is ranked[0]:
        return ranked
    guess = slot_guess(ref, ranked)
    load, best = usable_copy(node, ref, guess), usable_copy(ranked[0], ref, guess)
    if load is None or (node.fallback and not ranked[0].fallback):
        return ranked
    if not load.spare and (load.saturated or (best is not None and best.spare)):
        return ranked
    return [node, *(n for n in ranked if n is not node)]


def _load_in(loads: dict[str, ModelLoad], ref: str) -> ModelLoad | None:
    key = ref.lower()
    return next((m for r, m in loads.items() if r.lower() == key), None)


def _load_text(node: NodeView, ref: str) -> str:
    """One node's figures for a debug line: ``busy/slots`` of its copy, or ``free/memory``."""
    flags = "".join(f for f, on in ((" fallback", node.fallback), (" draining", node.draining)) if on)
    load = node.load_of(ref)
    if load is not None:
        return f"{load.busy}/{load.slots} busy{' (stopping)' if load.draining else ''}{flags}"
    return f"{node.free}/{node.memory} free{flags}"


def _log_seed(ref: str, ranked: list[NodeView], nodes: list[NodeView], tried: frozenset[str]) -> None:
    log.debug("placement of %s: %s (free/memory: %s)", ref, [n.name for n in ranked if n.name not in tried],
              {n.name: f"{n.free}/{n.memory}" for n in nodes})
