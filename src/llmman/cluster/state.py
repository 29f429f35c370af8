"""A node's state as its peers see it: the ``GET /llmman/node`` document, built and read in one place.

Document (bytes, counts)::

    {"memory": capacity, "free": capacity - loaded, "loaded": {ref: bytes}, "stored": {ref: bytes},
     "in_flight": n, "queued": n, "max_queue": n,
     "name": "spark", "id": "3f9a...", "version": "0.1.0", "state": "serving" | "draining", "fallback": false,
     "models": {ref: {"slots": n, "in_flight": n, "queued": n, "loading": bool, "draining": bool}},
     "devices": [{"index": i, "name": ..., "total": bytes, ..., "used": bytes, "utilisation": pct,
                  "temperature": celsius, "power": watts}],
     "transfers": [{"model": ref, "kind": "pull" | "copy", "source": host, "status": ..., "completed": bytes,
                    "total": bytes, "started_at": unix s, "elapsed": s, "error"?: ...}],
     "rpc": {"serve": bool, "reserved": bytes, "workers": n}}

The first line is the seed's shape (``memory``, ``loaded``, ``stored``), which is all an older node sends
and all :func:`parse_node` requires; the rest is optional on reading, so old and new nodes interoperate.
``memory`` is what llmman offers for models (0 = unknown: no limit is enforced); ``loaded`` counts each
loaded or loading model at llama-server's reported figure once loaded, else its estimate.
``id`` is this daemon process's random id (llmman.cluster.source.NODE_ID): a node that finds its own id in a
peer's document (reached through a DNS name, NAT or a port mapping) leaves that peer out.
``transfers`` lists the pulls and copies from a peer running on the node (llmman.registry.progress);
:func:`transfers_of` reads a peer's. ``rpc`` is what the node lends to peers splitting a model
(llmman.sched.lending, docs/split.md): ``serve`` (``rpc.serve``), the bytes ``reserved`` for the workers it
runs (counted by its admission, not in ``loaded``, and taken from ``free``) and how many ``workers``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from llmman import __version__
from llmman.cluster.placement import ModelLoad, NodeView
from llmman.cluster.source import NODE_ID
from llmman.sched.devices import device_document
from llmman.sched.gpu import NodeMemory, telemetry
from llmman.sched.scheduler import Scheduler
from llmman.sched.table import LoadedSnapshot
from llmman.store import Store

SERVING = "serving"
DRAINING = "draining"


def model_loads(snaps: Iterable[LoadedSnapshot]) -> dict[str, ModelLoad]:
    """Per loaded reference, how busy it is (an embedding child adds to its model's figures)."""
    out: dict[str, ModelLoad] = {}
    for snap in snaps:
        mine = ModelLoad(snap.slots, snap.in_flight, snap.queued, not snap.ready, snap.draining)
        seen = out.get(snap.reference)
        if seen is not None:
            mine = ModelLoad(seen.slots + mine.slots, seen.in_flight + mine.in_flight,
                             seen.queued + mine.queued, seen.loading and mine.loading,
                             seen.draining or mine.draining)
        out[snap.reference] = mine
    return out


def node_document(scheduler: Scheduler, store: Store, *, name: str, fallback: bool,
                  max_queue: int, transfers: list[dict[str, Any]] | None = None,
                  stored: Mapping[str, int] | None = None) -> dict[str, Any]:
    """This node's ``/llmman/node`` document (see the module docstring); ``transfers`` is the puller's
    table (llmman.registry.progress.Transfers.snapshot), none when not given; ``stored`` is the store's
    ``{name: size}`` when the caller has read it (llmman.store.listing.Listing.sizes), else it is read
    from ``store``."""
    snaps = scheduler.snapshot()
    loaded: dict[str, int] = {}
    for snap in snaps:
        loaded[snap.reference] = loaded.get(snap.reference, 0) + snap.memory
    capacity = scheduler.capacity
    queued = scheduler.queued()
    rpc = lent(scheduler)
    return {
        "memory": capacity,
        "free": max(0, capacity - sum(loaded.values()) - rpc["reserved"]),
        "loaded": loaded,
        "stored": dict(stored) if stored is not None else {m.reference: m.size for m in store.list()},
        "in_flight": sum(snap.refcount for snap in snaps) - queued,
        "queued": queued,
        "max_queue": max_queue,
        "name": name,
        "id": NODE_ID,
        "version": __version__,
        "state": DRAINING if scheduler.draining else SERVING,
        "fallback": fallback,
        "models": {ref: {"slots": m.slots, "in_flight": m.in_flight, "queued": m.queued,
                         "loading": m.loading, "draining": m.draining}
                   for ref, m in model_loads(snaps).items()},
        "devices": with_telemetry(device_document(scheduler.node_memory, snaps), scheduler.node_memory),
        "transfers": transfers or [],
        "rpc": rpc,
    }


def lent(scheduler: Scheduler) -> dict[str, Any]:
    """The ``rpc`` part: whether this node lends workers, the bytes they hold and how many
    (llmman.sched.scheduler.Scheduler's ``lends``, ``reserved`` and ``reservations``)."""
    return {"serve": scheduler.lends is True, "reserved": scheduler.reserved,
            "workers": scheduler.reservations}


def with_telemetry(devices: list[dict[str, Any]], node: NodeMemory | None) -> list[dict[str, Any]]:
    """``devices`` with each GPU's ``used`` bytes, ``utilisation`` (%), ``temperature`` (°C) and ``power``
    (W) where its driver reports them (llmman.sched.gpu.telemetry; none on CPU and Apple nodes)."""
    figures = telemetry(node.accelerator) if node is not None else {}
    for device in devices:
        found = figures.get(device["index"])
        if found is not None:
            device.update({k: v for k, v in (("used", found.used), ("utilisation", found.utilisation),
                                             ("temperature", found.temperature), ("power", found.power))
                           if v is not None})
    return devices


#: The largest figure read from a peer (bytes or a count): what a 64-bit integer holds, so a peer's
#: absurd number neither breaks this node's own JSON answers nor, summed, overflows them.
FIGURE_MAX = 2**63 - 1


def _figure(value: int) -> int:
    """A peer's figure within [0, FIGURE_MAX]: a negative one is 0 (it must not add room)."""
    return min(max(0, value), FIGURE_MAX)


def _int_table(value: object) -> dict[str, int] | None:
    if not isinstance(value, dict):
        return None
    out: dict[str, int] = {}
    for name, size in value.items():
        if not isinstance(name, str) or isinstance(size, bool) or not isinstance(size, int):
            return None
        out[name] = _figure(size)
    return out


def _count(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key)
    return _figure(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def _models(value: object) -> dict[str, ModelLoad]:
    """The optional ``models`` table; entries that are not objects are left out."""
    if not isinstance(value, dict):
        return {}
    return {ref: ModelLoad(_count(m, "slots"), _count(m, "in_flight"), _count(m, "queued"),
                           m.get("loading") is True, m.get("draining") is True)
            for ref, m in value.items() if isinstance(ref, str) and isinstance(m, dict)}


def parse_node(name: str, url: str, doc: object) -> NodeView | None:
    """A ``/llmman/node`` document as :class:`NodeView` named ``name``; None when the seed's part
    (``memory``, ``loaded``, ``stored``) is malformed. Newer fields are read when present and valid."""
    if not isinstance(doc, dict):
        return None
    memory = doc.get("memory")
    loaded, stored = _int_table(doc.get("loaded")), _int_table(doc.get("stored"))
    if isinstance(memory, bool) or not isinstance(memory, int) or loaded is None or stored is None:
        return None
    node = doc.get("name")
    state = DRAINING if doc.get("state") == DRAINING else SERVING
    rpc = doc.get("rpc")
    rpc = rpc if isinstance(rpc, dict) else {}
    return NodeView(name, _figure(memory), loaded, stored, url, node=node if isinstance(node, str) else "",
                    state=state, fallback=doc.get("fallback") is True, models=_models(doc.get("models")),
                    reserved=_count(rpc, "reserved"), lends=rpc.get("serve") is True,
                    lent=_count(rpc, "workers"))


#: At most this many transfers are read from a peer's document, each string clipped to TEXT_MAX.
TRANSFERS_MAX, TEXT_MAX = 64, 512
TRANSFER_KINDS = frozenset({"pull", "copy"})


def _text(value: object) -> str:
    return value[:TEXT_MAX] if isinstance(value, str) else ""


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:  # NaN
        return 0.0
    return float(min(max(0.0, value), FIGURE_MAX))


def transfers_of(doc: object) -> list[dict[str, Any]]:
    """The optional ``transfers`` of a ``/llmman/node`` document, checked: entries that are not objects,
    lack a model or name another kind are left out; figures clamped, strings clipped (an older node sends
    none: an empty list)."""
    value = doc.get("transfers") if isinstance(doc, dict) else None
    if not isinstance(value, list):
        return []
    out: list[dict[str, Any]] = []
    for entry in value[:TRANSFERS_MAX]:
        if not isinstance(entry, dict) or not _text(entry.get("model")) \
                or entry.get("kind") not in TRANSFER_KINDS:
            continue
        total = _count(entry, "total")
        item: dict[str, Any] = {
            "model": _text(entry["model"]), "kind": entry["kind"], "source": _text(entry.get("source")),
            "status": _text(entry.get("status")), "completed": min(_count(entry, "completed"), total),
            "total": total, "started_at": _seconds(entry.get("started_at")),
            "elapsed": _seconds(entry.get("elapsed"))}
        if isinstance(entry.get("error"), str):
            item["error"] = _text(entry["error"])
        out.append(item)
    return out
