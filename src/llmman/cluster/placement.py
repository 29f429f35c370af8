"""Where a request goes: pure functions of node snapshots (:class:`NodeView`, :class:`ModelLoad`).

The seed's rules (docs/aggregation.md, :func:`rank`, and ``aggregation.spread = off``):

1. a node that has the model **loaded** — never a second copy;
2. else, of the nodes the model **fits** on (free = memory minus what is loaded), one that has it
   **stored** — loading from disk beats pulling over the network;
3. else the node with the **most room**.

Ties go to this node. Unknown memory (``0``) fits anything and ranks last on room. Within rule 1
and rule 2 the node with more room comes first, so the result is a full ranking: the first entry is
the choice and the rest are the fallbacks a forward tries when a peer fails before its first byte.

Spreading (``spread = loaded`` or ``replicas``, :func:`rank_spread`) ranks on the loaded copies' slots
instead, may place another copy (:func:`saturated_everywhere` says when that is wanted), and with every
policy fallback nodes come after the others and draining nodes last
(docs/aggregation.md#spreading-and-replicas).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

LOCAL = "local"


@dataclass(frozen=True)
class ModelLoad:
    """How busy one loaded model is on a node (``/llmman/node`` ``models``).

    Attributes:
        slots: llama-server slots (requests served at once); 0 = unknown (an older node).
        in_flight: requests being served now.
        queued: requests waiting for a slot or for the load.
        loading: the model is still loading.
        draining: an unload was asked for: it takes no new requests and goes when these finish.
    """

    slots: int = 0
    in_flight: int = 0
    queued: int = 0
    loading: bool = False
    draining: bool = False

    @property
    def busy(self) -> int:
        """Requests on this copy, served or waiting."""
        return self.in_flight + self.queued

    @property
    def spare(self) -> int:
        """Slots free for one more request now (never negative; unknown slots count as one)."""
        return max(0, (self.slots or 1) - self.busy)

    @property
    def saturated(self) -> bool:
        """Every slot busy and requests waiting: one more request would wait too."""
        return self.busy >= (self.slots or 1) and self.queued > 0


@dataclass(frozen=True)
class NodeView:
    """One node as a placement sees it (``GET /llmman/node``).

    Attributes:
        name: ``local`` for this node, else the peer's ``host:port``.
        memory: bytes llmman may fill with models; 0 = unknown.
        loaded: reference -> bytes of each loaded model.
        stored: reference -> weight bytes of each stored model.
        url: the peer's base URL (``http://host:port``); empty for this node.
        node: the node's own name (``node.name``); empty from an older node.
        state: ``serving`` or ``draining`` (takes no new placements).
        fallback: a fallback-only node (``node.fallback``).
        models: reference -> how busy each loaded model is (empty from an older node).
        reserved: bytes held by ``ggml-rpc-server`` workers this node runs for peers' split models
            (``rpc.reserved``; docs/split.md): taken like a loaded model's.
        lends: the node starts RPC workers for peers (``rpc.serve``).
        lent: how many RPC workers it runs for peers now (``rpc.workers``).
    """

    name: str
    memory: int
    loaded: Mapping[str, int] = field(default_factory=dict)
    stored: Mapping[str, int] = field(default_factory=dict)
    url: str = ""
    node: str = ""
    state: str = "serving"
    fallback: bool = False
    models: Mapping[str, ModelLoad] = field(default_factory=dict)
    reserved: int = 0
    lends: bool = False
    lent: int = 0

    @property
    def draining(self) -> bool:
        return self.state == "draining"

    def load_of(self, ref: str) -> ModelLoad | None:
        """How busy ``ref`` is here (case-insensitive), or None when it is not loaded or unknown."""
        key = ref.lower()
        return next((m for name, m in self.models.items() if name.lower() == key), None)

    @property
    def is_local(self) -> bool:
        return self.name == LOCAL

    @property
    def free(self) -> int:
        """Bytes not taken by loaded models or lent RPC workers (0 when memory is unknown)."""
        return max(0, self.memory - sum(self.loaded.values()) - self.reserved)

    def has_loaded(self, ref: str) -> bool:
        return _has(self.loaded, ref)

    def has_stored(self, ref: str) -> bool:
        return _has(self.stored, ref)


def _has(table: Mapping[str, int], ref: str) -> bool:
    key = ref.lower()
    return any(name.lower() == key for name in table)


def model_size(ref: str, nodes: Sequence[NodeView]) -> int:
    """The model's weight bytes as the first node storing it reports them; 0 when none does."""
    key = ref.lower()
    for node in nodes:
        for name, size in node.stored.items():
            if name.lower() == key:
                return size
    return 0


def fits(node: NodeView, size: int) -> bool:
    """True when ``size`` bytes fit in the node's free memory; unknown memory fits anything."""
    return node.memory <= 0 or node.free >= size


def rank(ref: str, size: int, nodes: Sequence[NodeView]) -> list[NodeView]:
    """Every node, best first, by the rules above.

    Args:
        ref: the model's full reference (``docker.io/ai/smollm2:135m``), matched case-insensitively.
        size: its weight bytes (see :func:`model_size`).
        nodes: this node first (its position breaks ties), then the peers that answered.
    """
    return [node for _, node in sorted(enumerate(nodes), key=lambda item: _seed_key(ref, size, *item))]


def place(ref: str, nodes: Sequence[NodeView]) -> NodeView:
    """The node that should serve ``ref`` (the first of :func:`rank`); ``nodes`` must not be empty."""
    return rank(ref, model_size(ref, nodes), nodes)[0]


# --- Spreading (docs/aggregation.md#spreading-and-replicas) ----------------------------------------------

OFF, LOADED, REPLICAS = "off", "loaded", "replicas"
SPREADS = (OFF, LOADED, REPLICAS)

# Tiers of the spreading ranking, best first: a primary (non-fallback) node's spare copy, a primary node
# that may load a copy, the same two on fallback nodes, then copies without a spare slot, then every other
# node (the failover list), and draining nodes or copies last.
_P_SPARE, _P_LOAD, _F_SPARE, _F_LOAD, _P_BUSY, _F_BUSY, _OTHER, _DRAIN = range(8)


def slot_guess(ref: str, nodes: Sequence[NodeView]) -> int:
    """The slots to assume for a copy of ``ref`` whose node does not say (a copy a forward is making a
    peer load, counted before the peer reports it, or an older node): the most any copy reports, as the
    nodes of a pool usually run alike; 0 when none reports any."""
    return max((load.slots for n in nodes if (load := n.load_of(ref)) is not None), default=0)


def usable_copy(node: NodeView, ref: str, slots: int = 0) -> ModelLoad | None:
    """The copy of ``ref`` on ``node`` that may take a new request, or None: not loaded there, the node
    is draining, or the copy is (being stopped). A copy whose slots are unknown gets ``slots``
    (:func:`slot_guess`); still unknown, it counts as one slot."""
    if node.draining or not node.has_loaded(ref):
        return None
    load = node.load_of(ref) or ModelLoad()
    if load.draining:
        return None
    return dataclasses.replace(load, slots=slots) if not load.slots and slots else load


def copies(ref: str, nodes: Sequence[NodeView]) -> int:
    """How many copies of ``ref`` the pool has that take new requests."""
    return sum(1 for n in nodes if usable_copy(n, ref) is not None)


def _primary_loads(ref: str, nodes: Sequence[NodeView]) -> list[ModelLoad]:
    guess = slot_guess(ref, nodes)
    return [load for n in nodes if not n.fallback and (load := usable_copy(n, ref, guess)) is not None]


def saturated_everywhere(ref: str, nodes: Sequence[NodeView]) -> bool:
    """True when ``ref`` has at least one copy on a primary (non-fallback) node and every such copy is
    saturated (all slots busy and requests waiting): the condition that, held for
    ``aggregation.replica_after``, lets another copy load."""
    loads = _primary_loads(ref, nodes)
    return bool(loads) and all(load.saturated for load in loads)


def backlogged_everywhere(ref: str, nodes: Sequence[NodeView]) -> bool:
    """True when ``ref`` has at least one copy on a primary node and every such copy has a whole round
    waiting (as many requests queued beyond its busy slots as it has slots): a burst that size would wait
    a whole generation or more, so another copy is due at once rather than after ``replica_after``."""
    loads = _primary_loads(ref, nodes)
    return bool(loads) and all(load.busy >= 2 * (load.slots or 1) for load in loads)


def _draining_here(node: NodeView, ref: str) -> bool:
    """The node is draining, or its copy of ``ref`` is being stopped."""
    return node.draining or (node.has_loaded(ref) and usable_copy(node, ref) is None)


def _seed_key(ref: str, size: int, position: int, node: NodeView) -> tuple[int, int, int, int, int]:
    """The seed's ordering (see :func:`rank`): loaded, stored and fits, known memory, most room, local."""
    loaded = 0 if node.has_loaded(ref) else 1
    stored_fit = 0 if loaded == 0 or (fits(node, size) and node.has_stored(ref)) else 1
    unknown = 1 if node.memory <= 0 else 0
    return (loaded, stored_fit, unknown, -node.free, 0 if node.is_local else 1 + position)


def rank_off(ref: str, size: int, nodes: Sequence[NodeView]) -> list[NodeView]:
    """``spread = off``: :func:`rank`, the seed's rules, with two later rules on top, which change
    nothing in a pool without them: a draining node (or copy) goes last, and fallback nodes go after the
    primary nodes when one of those has the model loaded or room for it."""
    ranked = rank(ref, size, nodes)
    primary_serves = any(not n.fallback and not _draining_here(n, ref)
                         and (n.has_loaded(ref) or fits(n, size)) for n in nodes)

    def tier(node: NodeView) -> int:
        if _draining_here(node, ref):
            return 2
        return 1 if node.fallback and primary_serves else 0

    return sorted(ranked, key=tier)


def rank_spread(ref: str, size: int, nodes: Sequence[NodeView], *, fill: bool,
                replica: bool) -> list[NodeView]:
    """Every node, best first, when requests spread over loaded copies (``spread = loaded`` or
    ``replicas``; docs/aggregation.md#spreading-and-replicas).

    1. A primary node's copy with a spare slot: this node's first; then, with ``fill``, in the order of
       ``nodes`` (so the same copy keeps taking light traffic and an extra one can go idle and unload),
       else the one with the most spare slots.
    2. A primary node without a copy where the model fits, by the seed's rules 2 and 3 (stored and fits,
       then most room) — only when no primary node has a copy, or when ``replica`` (another copy is due).
    3. and 4. The same two on fallback nodes.
    5. and 6. Copies without a spare slot, primary then fallback, the least busy for its slots first
       (ties: this node, then the order of ``nodes``).
    7. Every other node (where a forward goes when the ones above fail): those the model fits on, primary
       then fallback, then the rest, each by the seed's rules; 8. draining nodes and copies being stopped,
       by the seed's rules.

    Args:
        ref: the model's full reference; size: its weight bytes (:func:`model_size`).
        nodes: this node first, then the peers that answered.
        fill: fill copies in a stable order (``replicas``) rather than by most spare (``loaded``).
        replica: another copy may load now (every primary copy saturated long enough, under the limit).
    """
    guess = slot_guess(ref, nodes)
    primary_copy = any(not n.fallback and usable_copy(n, ref) is not None for n in nodes)
    load_allowed = replica or not primary_copy

    def key(item: tuple[int, NodeView]) -> tuple[float, ...]:
        position, node = item
        here = 0 if node.is_local else 1 + position
        fb = 1 if node.fallback else 0
        if _draining_here(node, ref):
            return (_DRAIN, fb, *_seed_key(ref, size, position, node))
        load = usable_copy(node, ref, guess)
        if load is not None and load.spare:
            order = (here,) if fill or node.is_local else (-load.spare, here)
            return (_F_SPARE if fb else _P_SPARE, 0 if node.is_local else 1, *order)
        if load is not None:
            return (_F_BUSY if fb else _P_BUSY, load.busy / (load.slots or 1), here)
        if load_allowed and fits(node, size):
            return (_F_LOAD if fb else _P_LOAD, *_seed_key(ref, size, position, node))
        return (_OTHER, 0 if fits(node, size) else 1, fb, *_seed_key(ref, size, position, node))

    return [node for _, node in sorted(enumerate(nodes), key=key)]
