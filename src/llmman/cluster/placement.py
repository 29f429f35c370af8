"""Where a request for a model not loaded on this node goes: a pure function of node snapshots.

The rules (docs/aggregation.md):

1. a node that has the model **loaded** — never a second copy;
2. else, of the nodes the model **fits** on (free = memory minus what is loaded), one that has it
   **stored** — loading from disk beats pulling over the network;
3. else the node with the **most room**.

Ties go to this node. Unknown memory (``0``) fits anything and ranks last on room. Within rule 1
and rule 2 the node with more room comes first, so the result is a full ranking: the first entry is
the choice and the rest are the fallbacks a forward tries when a peer fails before its first byte.
"""

from __future__ import annotations

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
        """Bytes not taken by loaded models (0 when memory is unknown)."""
        return max(0, self.memory - sum(self.loaded.values()))

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
    def key(item: tuple[int, NodeView]) -> tuple[int, int, int, int, int]:
        position, node = item
        loaded = 0 if node.has_loaded(ref) else 1
        stored_fit = 0 if loaded == 0 or (fits(node, size) and node.has_stored(ref)) else 1
        unknown = 1 if node.memory <= 0 else 0
        return (loaded, stored_fit, unknown, -node.free, 0 if node.is_local else 1 + position)

    return [node for _, node in sorted(enumerate(nodes), key=key)]


def place(ref: str, nodes: Sequence[NodeView]) -> NodeView:
    """The node that should serve ``ref`` (the first of :func:`rank`); ``nodes`` must not be empty."""
    return rank(ref, model_size(ref, nodes), nodes)[0]
