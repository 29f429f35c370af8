"""One model across nodes: whether a model is split, and how (pure; docs/split.md "How a split is planned").

A split runs one ``llama-server`` on this node with ``--rpc`` naming ``ggml-rpc-server`` workers that
peers lend (``rpc.serve``). llama.cpp keeps the first ``n_layer - ngl`` layers, the input embedding
(``token_embd``) and every other tensor outside the repeating layers on the main node and puts the last
``ngl`` layers on the RPC devices, in ``--tensor-split`` proportions, in ``--rpc`` order; each layer's KV
cache lives where the layer does. So a model's memory is read as:

- **head** (this node, whatever the split): the tensors outside ``blk.N.`` (embedding, output norm, output
  head), the output buffer and one compute buffer (llmman.sched.memory.estimate's figures);
- **per layer** (wherever the layer goes): its ``blk.N.`` tensors plus its KV cache (the difference the
  layer makes to llmman.sched.memory.estimate, so sliding-window layers count their smaller cache);
- **per worker**: one compute buffer (llama.cpp allocates one on every backend the graph uses).

On a node with GPUs (:func:`on_gpus`) this node's share goes on them instead of its CPU: llama.cpp lists
the RPC devices first and the local GPUs after them (src/llama.cpp, "add RPC servers at the front of the
list"), and gives offloaded layer ``il`` to the first device whose cumulative ``--tensor-split`` part
exceeds ``il / (n_layer + 1)`` (src/llama-model.cpp), so with every layer offloaded the workers take the
first layers, in ``--rpc`` order, and this node's GPUs the last ones and the output layer; the input
embedding stays on this node's CPU whatever the flags (llama.cpp never offloads the input layer).

:func:`needs_split` is the trigger; :func:`plan_split` the shares; :func:`device_split` the whole
``--tensor-split`` of a child on this node's GPUs. They read nodes as placement does
(llmman.cluster.placement.NodeView).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from llmman.cluster.placement import LOCAL, NodeView
from llmman.errors import LlmmanError
from llmman.gguf import GGUFInfo
from llmman.gguf.types import GGML_TYPES
from llmman.sched.devices import Placement
from llmman.sched.gpu import NodeMemory
from llmman.sched.memory import N_UBATCH, estimate
from llmman.sizes import format_bytes

__all__ = ["ALWAYS", "AUTO", "NEVER", "Costs", "Share", "SplitPlan", "costs_of", "device_split",
           "local_parts", "needs_split", "on_gpus", "plan_split"]

AUTO, ALWAYS, NEVER = "auto", "always", "never"
LOCAL_GPUS = frozenset({"cuda", "rocm", "metal"})
"""Accelerators whose devices llama.cpp lists after the RPC devices and offloads layers to."""
_BLOCK = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class Costs:
    """A model's memory as a split divides it (bytes; see the module docstring).

    Attributes:
        head: what stays on the node that runs llama-server whatever the split.
        layers: each repeating layer's weights plus its KV cache, layer 0 first.
        compute: the compute buffer every node that takes layers needs (the head already counts one).
    """

    head: int
    layers: tuple[int, ...]
    compute: int

    @property
    def total(self) -> int:
        """The whole model on one node (head and every layer)."""
        return self.head + sum(self.layers)


@dataclass(frozen=True)
class Share:
    """One node's part of a split.

    Attributes:
        node: ``local`` for this node, else the peer's name (``host:port``, NodeView.name).
        url: the peer's base URL (where its ``/llmman/rpc/workers`` are); empty for this node.
        label: the node's own name (``node.name``) where known, else ``node``; what ``/api/ps`` shows.
        layers: repeating layers it holds.
        memory: bytes it holds (this node: the head and its layers; a worker: its layers and a compute
            buffer): what its worker reserves, or what this node admits the child with.
    """

    node: str
    url: str
    label: str
    layers: int
    memory: int


@dataclass(frozen=True)
class SplitPlan:
    """Where a split model's layers go. On this node's CPU (``gpus`` False) this node keeps the first
    ``local.layers`` and the workers the rest in their order (``--rpc`` order, RPC0 first); on this node's
    GPUs (``gpus``) the workers take the first layers in their order and this node the last ones."""

    local: Share
    workers: tuple[Share, ...]
    gpus: bool = False

    @property
    def n_gpu_layers(self) -> int:
        """``-ngl``. On this node's CPU: the workers' layers plus one (llama.cpp offloads the last ``ngl``
        of ``n_layer + 1`` layers, the output layer being the last one; llmman keeps the output tensor on
        this node, llmman.runner.argv.KEEP_LOCAL, so that slot holds no weights). On its GPUs: every layer
        and the output layer."""
        if not self.workers:
            return 0
        if self.gpus:
            return self.local.layers + sum(w.layers for w in self.workers) + 1
        return sum(w.layers for w in self.workers) + 1

    @property
    def tensor_split(self) -> tuple[int, ...]:
        """The workers' ``--tensor-split`` parts: each worker's layer count in ``--rpc`` order, on this
        node's CPU the last one's plus the output slot (llama.cpp gives device d the offloaded layers whose
        position falls in its cumulative part, so these proportions put exactly those layers on each
        worker). On its GPUs the output slot is this node's (:attr:`local_slots`)."""
        counts = [w.layers for w in self.workers]
        if counts and not self.gpus:
            counts[-1] += 1
        return tuple(counts)

    @property
    def local_slots(self) -> int:
        """Offloaded layers on this node's GPUs, after the workers': its layers and the output layer; 0 when
        its share runs on its CPU (the layers llama.cpp does not offload)."""
        return self.local.layers + 1 if self.gpus and self.workers else 0

    @property
    def shares(self) -> tuple[Share, ...]:
        """Every node's share, this node first."""
        return (self.local, *self.workers)


def _nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    kind = GGML_TYPES.get(ggml_type)
    if kind is None:
        return 0
    n = 1
    for dim in shape:
        n *= dim
    return -(-n // kind[1]) * kind[2]


def costs_of(info: GGUFInfo, *, n_ctx: int, n_parallel: int = 1, n_ubatch: int = N_UBATCH,
             extra_weights: int = 0) -> Costs:
    """``info``'s model served with ``n_parallel`` slots of ``n_ctx`` tokens, divided as a split divides it.

    Each layer's KV is the difference it makes to llmman.sched.memory.estimate (the estimate of the first
    ``l + 1`` layers minus that of the first ``l``), so the one KV rule stays there. Weights are summed per
    ``blk.N.`` tensor; a tensor of a type this reader does not know counts in the head. The parts add up to
    the estimate's total (``Costs.total`` = weights + KV + compute + output)."""
    layers = info.block_count or 0
    whole = estimate(info, n_ctx=n_ctx, n_parallel=n_parallel, n_ubatch=n_ubatch, extra_weights=extra_weights)
    weights = [0] * layers
    for tensor in info.tensors:
        match = _BLOCK.match(tensor.name)
        if match is not None and int(match.group(1)) < layers:
            weights[int(match.group(1))] += _nbytes(tensor.ggml_type, tensor.shape)
    kv_before, per_layer = 0, []
    for layer in range(layers):
        upto = estimate(dataclasses.replace(info, block_count=layer + 1), n_ctx=n_ctx, n_parallel=n_parallel,
                        n_ubatch=n_ubatch).kv
        per_layer.append(weights[layer] + upto - kv_before)
        kv_before = upto
    head = whole.total - sum(per_layer)
    return Costs(head=head, layers=tuple(per_layer), compute=whole.compute)


def on_gpus(node: NodeMemory | None, n_gpu_layers: int | None) -> bool:
    """Does this node's share of a split go on its GPUs? When its accelerator is one whose devices
    llama.cpp offloads to after the RPC devices (:data:`LOCAL_GPUS`), it found devices, and the model is
    not asked to stay off them (``num_gpu`` / preset ``gpu_layers`` 0)."""
    return (node is not None and node.accelerator in LOCAL_GPUS and bool(node.devices)
            and n_gpu_layers != 0)


def local_parts(placement: Placement | None, pin: str | None) -> tuple[float, ...]:
    """The fraction of this node's share on each GPU its child sees, in the child's order (after the RPC
    devices): where admission placed it (llmman.sched.devices.place) — the placement's devices, or with
    a preset's ``devices`` pin every pinned device in the pin's order, 0 for those not used — else the
    first device the child sees (one Metal device; a pin that names no index)."""
    if placement is None:
        return (1.0,)
    if pin is None:
        return placement.split
    try:
        return tuple(placement.share(int(part)) for part in pin.split(","))
    except ValueError:
        return (1.0,)


def device_split(workers: Sequence[int], local_slots: int, parts: Sequence[float]) -> tuple[int, ...]:
    """The whole ``--tensor-split`` of a child on this node's GPUs: the workers' layer counts
    (SplitPlan.tensor_split), then ``local_slots`` (SplitPlan.local_slots) divided over this node's GPUs in
    proportion to ``parts`` (:func:`local_parts`; whole slots, the largest remainders first, the last
    slot, the output layer, on the last GPU that gets any). Just ``workers`` when ``local_slots`` is 0."""
    if local_slots <= 0:
        return tuple(workers)
    weights = [max(0.0, p) for p in parts] or [1.0]
    total = sum(weights)
    if total <= 0:
        weights, total = [1.0] + [0.0] * (len(weights) - 1), 1.0
    exact = [local_slots * w / total for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[:local_slots - sum(counts)]:
        counts[i] += 1
    return (*workers, *counts)


def needs_split(estimate_bytes: int, nodes: Sequence[NodeView], preset_split: str | None) -> bool:
    """Split the model? The one rule (issue 16): never with preset ``split = "never"``, nor when no peer in
    ``nodes`` lends workers (``rpc.serve``, not draining: the model then loads, or fails, as it always did);
    with ``"always"`` whenever one does; else (``"auto"``, no preset) only when ``estimate_bytes`` exceeds
    the capacity (``memory``) of every node in ``nodes`` (this one and every peer seen). A node of unknown
    memory (0) fits anything; a model that fits one node is never split."""
    lenders = any(not n.is_local and n.lends and not n.draining for n in nodes)
    if preset_split == NEVER or not lenders:
        return False
    if preset_split == ALWAYS:
        return True
    return estimate_bytes > 0 and all(0 < n.memory < estimate_bytes for n in nodes)


def _room(node: NodeView, whole: int, evict: bool) -> int:
    """What ``node`` can take: its free bytes (memory minus loaded models and lent workers), or with
    ``evict`` also what its idle models hold (admission unloads those for a load: docs/memory.md); a model
    this node does not report as idle (busy, loading, or from an older node without ``models``) stays. A
    node of unknown memory takes the whole model."""
    if node.memory <= 0:
        return whole
    if not evict:
        return node.free
    held = 0
    for ref, size in node.loaded.items():
        load = node.load_of(ref)
        if load is None or load.busy or load.loading:
            held += size
    return max(0, node.memory - held - node.reserved)


def _assign(layers: Sequence[int], avail: Sequence[int]) -> list[int] | None:
    """Layer counts per node (in order, contiguous), in proportion to each node's room, each within it;
    None when the layers do not fit. Proportional boundaries first; where rounding a layer over a boundary
    overfills a node, the nodes are filled in order instead."""
    total, room = sum(layers), sum(avail)
    if total > room:
        return None
    counts = [0] * len(avail)
    node, done = 0, 0
    bounds: list[float] = []
    acc = 0
    for part in avail:
        acc += part
        bounds.append(acc / room * total if room else 0.0)
    for cost in layers:
        middle = done + cost / 2
        while node < len(avail) - 1 and middle > bounds[node]:
            node += 1
        counts[node] += 1
        done += cost
    if _fits(layers, counts, avail):
        return counts
    counts, node, used = [0] * len(avail), 0, 0
    for cost in layers:
        while node < len(avail) and used + cost > avail[node]:
            node, used = node + 1, 0
        if node == len(avail):
            return None
        counts[node] += 1
        used += cost
    return counts


def _fits(layers: Sequence[int], counts: Sequence[int], avail: Sequence[int]) -> bool:
    start = 0
    for count, room in zip(counts, avail, strict=True):
        if sum(layers[start:start + count]) > room:
            return False
        start += count
    return True


def plan_split(reference: str, costs: Costs, local: NodeView, peers: Sequence[NodeView], *,
               gpus: bool = False) -> SplitPlan:
    """The split of ``reference``: this node (``local``, which runs llama-server) keeps the head and the
    first layers (with ``gpus``, :func:`on_gpus`: the last layers, on its GPUs); each peer that lends
    workers (``lends``, not draining) and has room for a compute buffer and a layer takes the other layers,
    peers with most room first; the layers go in proportion to the room each node has beyond its fixed
    part. The room is free memory (placement's NodeView.free) when the split fits in it, else free memory
    plus what idle models hold (their nodes unload them, as for any load). Workers that would get no layer
    are left out.

    Raises:
        LlmmanError: 507 ``insufficient_memory`` naming the bytes missing, when this node cannot hold the
            head or the pool cannot hold every layer, even without its idle models.
    """
    try:
        return _plan(reference, costs, local, peers, evict=False, gpus=gpus)
    except LlmmanError:
        return _plan(reference, costs, local, peers, evict=True, gpus=gpus)


def _plan(reference: str, costs: Costs, local: NodeView, peers: Sequence[NodeView], *, evict: bool,
          gpus: bool) -> SplitPlan:
    whole = costs.total + costs.compute * max(1, len(peers))
    local_room = _room(local, whole, evict)
    if local_room < costs.head:
        raise LlmmanError(
            f"model {reference} needs {format_bytes(costs.total)}, more than any node has, and cannot be "
            f"split from this node: it keeps the embeddings and buffers, {format_bytes(costs.head)}, but has "
            f"{format_bytes(local_room)} for them, idle models unloaded: it lacks "
            f"{format_bytes(costs.head - local_room)}", status=500, code="insufficient_memory")
        # 500, not 507: this node's own shortfall (another node may hold the head), as admission's
    lenders = sorted((p for p in peers if p.lends and not p.draining and not p.is_local
                      and _room(p, whole, evict) > costs.compute),
                     key=lambda p: (-_room(p, whole, evict), p.name))
    avail = [_room(p, whole, evict) - costs.compute for p in lenders]
    # in llama.cpp's device order: this node's CPU before the RPC devices, its GPUs after them
    avail = [*avail, local_room - costs.head] if gpus else [local_room - costs.head, *avail]
    counts = _assign(costs.layers, avail)
    if counts is None:
        missing = sum(costs.layers) - sum(avail)
        largest = format_bytes(max(costs.layers))
        short = f"it still lacks {format_bytes(missing)}" if missing > 0 else \
            f"the room is there in all but not in whole layers (the largest needs {largest})"
        # 507: the whole pool lacks the memory, which no other node would find otherwise (it does not move
        # on to the peers: api/inference.moves_on)
        raise LlmmanError(
            f"model {reference} needs {format_bytes(costs.total)}, more than any node has; "
            f"split over this node and {len(lenders)} peer(s) lending RPC workers, idle models unloaded, "
            f"{short}", status=507, code="insufficient_memory")
    own, theirs = (counts[-1], counts[:-1]) if gpus else (counts[0], counts[1:])
    start = 0 if gpus else own
    workers = []
    for peer, count in zip(lenders, theirs, strict=True):
        if count:
            memory = costs.compute + sum(costs.layers[start:start + count])
            workers.append(Share(peer.name, peer.url, peer.node or peer.name, count, memory))
        start += count
    mine_layers = costs.layers[start:] if gpus else costs.layers[:own]
    mine = Share(LOCAL, "", local.node or LOCAL, own, costs.head + sum(mine_layers))
    return SplitPlan(mine, tuple(workers), gpus)
