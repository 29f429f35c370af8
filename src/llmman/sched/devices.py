"""Where a model goes among the devices of one node: each device's room, a model's placement on them, and
the device flags of its child. Pure functions of device snapshots (table-tested in
tests/unit/test_sched_devices.py); rules in docs/memory.md ("Per device").

- Placement is per device on a GPU node (``cuda``, ``rocm``) with a capacity. A host-only node (``cpu``,
  ``metal``: one RAM device) and an unknown one (no device) keep the node-wide rule of
  llmman.sched.admission: :func:`per_device` is False there and no model gets a placement.
- Each device offers its share of the node's capacity (:attr:`llmman.sched.gpu.NodeMemory.capacity`),
  in proportion to its total: ``resources.memory`` and ``resources.reserve`` weigh on every device alike.
- What is planned on a device is the sum, over the admitted models, of each one's memory times its share
  there (:class:`Placement`); a model admitted without a placement counts on every device in proportion
  to the device's capacity.
- A model pinned by its preset (``devices = "0,1"``) may use only those devices; an unpinned one any.
  :func:`place` picks the device with most room that holds the whole model; else the fewest devices with
  most room that hold it together, with a tensor split in proportion to each one's room (Ollama's rule);
  else nothing fits and the caller makes room (llmman.sched.eviction) or waits.
- A pin that names no known device by its index (a UUID, an index the node has not) cannot be placed:
  :func:`allowed_devices` is None and such a model is admitted against the whole node, as before.

Device indexes are the driver's (NVML's, as ``nvidia-smi`` numbers them; the AMD cards in sysfs order).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmman.sched.gpu import NodeMemory

__all__ = [
    "GPU_KINDS",
    "VISIBLE",
    "ChildDevices",
    "DeviceRoom",
    "Load",
    "Placement",
    "allowed_devices",
    "child_devices",
    "device_document",
    "frees_on",
    "per_device",
    "place",
    "rooms",
    "shortfall",
]

GPU_KINDS = frozenset({"cuda", "rocm"})
"""Accelerators whose devices are placed one by one (the others have one pool of RAM, or none)."""

VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}
"""The variable that shows an unpinned child its devices, per accelerator (the driver's numbering)."""


@dataclass(frozen=True)
class Placement:
    """Where an admitted model sits.

    Attributes:
        devices: the driver's indexes of the devices it uses, most room first.
        split: the fraction of the model on each of ``devices`` (same order, summing to 1); ``(1.0,)`` for
            one device.
        kind: the node's accelerator (``cuda``, ``rocm``), which names the child's variable (:data:`VISIBLE`).
    """

    devices: tuple[int, ...]
    split: tuple[float, ...]
    kind: str = "cuda"

    def share(self, index: int) -> float:
        """The fraction of the model on device ``index`` (0 when it does not use it)."""
        for device, fraction in zip(self.devices, self.split, strict=True):
            if device == index:
                return fraction
        return 0.0


@dataclass(frozen=True)
class DeviceRoom:
    """One device as admission sees it (bytes).

    Attributes:
        index: the driver's index.
        name: what the driver calls it.
        total: its memory.
        capacity: its share of the node's capacity (what llmman may fill on it).
        planned: what the admitted models take on it.
        models: the references of the admitted models with a part on it.
    """

    index: int
    name: str
    total: int
    capacity: int
    planned: int
    models: tuple[str, ...] = ()

    @property
    def free(self) -> int:
        """Room left for models: ``capacity - planned``, at least 0."""
        return max(0, self.capacity - self.planned)


@dataclass(frozen=True)
class Load:
    """An admitted model as counted on devices: its reference, bytes (llmman.sched.table.LoadedModel.memory)
    and placement (None: spread over every device in proportion to its capacity)."""

    reference: str
    memory: int
    placement: Placement | None


class Placed(Protocol):
    """What :func:`device_document` reads of a loaded model (llmman.sched.table.LoadedSnapshot has it)."""

    @property
    def reference(self) -> str: ...

    @property
    def memory(self) -> int: ...

    @property
    def placement(self) -> Placement | None: ...


def per_device(node: NodeMemory | None) -> bool:
    """True when models are placed device by device on ``node``: a GPU node with devices and a capacity."""
    return node is not None and node.accelerator in GPU_KINDS and bool(node.devices) and node.capacity > 0


def _capacities(node: NodeMemory) -> list[int]:
    """Each device's share of ``node.capacity``, in proportion to its total (their sum <= the capacity)."""
    total = node.total
    if total <= 0:
        return [0 for _ in node.devices]
    return [node.capacity * d.total // total for d in node.devices]


def _part(load: Load, index: int, capacity: int, node_capacity: int) -> int:
    """Bytes of ``load`` on device ``index`` (of ``capacity`` out of the node's ``node_capacity``)."""
    if load.placement is not None:
        fraction = load.placement.share(index)
    else:
        fraction = capacity / node_capacity if node_capacity > 0 else 0.0
    return math.ceil(load.memory * fraction) if fraction > 0 else 0


def rooms(node: NodeMemory, loads: Iterable[Load]) -> list[DeviceRoom]:
    """Every device of ``node`` with its capacity and what ``loads`` plan on it, in the node's order."""
    loads = list(loads)
    capacities = _capacities(node)
    whole = sum(capacities)
    out = []
    for device, capacity in zip(node.devices, capacities, strict=True):
        parts = [(load.reference, _part(load, device.index, capacity, whole)) for load in loads]
        out.append(DeviceRoom(device.index, device.name, device.total, capacity,
                              planned=sum(size for _, size in parts),
                              models=tuple(dict.fromkeys(ref for ref, size in parts if size > 0))))
    return out


def allowed_devices(room: Sequence[DeviceRoom], pin: str | None) -> tuple[int, ...] | None:
    """The devices a model may use: every device when ``pin`` is None, else those its preset names
    (``devices = "0,1"``, in that order); None when the pin names something else than a known index."""
    known = [r.index for r in room]
    if pin is None:
        return tuple(known)
    try:
        wanted = tuple(int(part) for part in pin.split(","))
    except ValueError:
        return None
    if not wanted or any(index not in known for index in wanted):
        return None
    return tuple(dict.fromkeys(wanted))


def _among(room: Sequence[DeviceRoom], allowed: Collection[int]) -> list[DeviceRoom]:
    """The rooms of ``allowed``, most room first (ties: the lower index)."""
    return sorted((r for r in room if r.index in allowed), key=lambda r: (-r.free, r.index))


def place(need: int, room: Sequence[DeviceRoom], allowed: Collection[int], *, kind: str = "cuda",
          ) -> Placement | None:
    """Where a model of ``need`` bytes goes among the ``allowed`` devices (of accelerator ``kind``), or None
    when it fits nowhere now.

    The device with most room if it holds the whole model; else the fewest devices, most room first, that
    hold it together, each taking a part in proportion to its room.
    """
    candidates = _among(room, allowed)
    if not candidates:
        return None
    if need <= candidates[0].free:
        return Placement((candidates[0].index,), (1.0,), kind)
    chosen: list[DeviceRoom] = []
    for r in candidates:
        if r.free <= 0:
            break
        chosen.append(r)
        together = sum(c.free for c in chosen)
        if together >= need:
            return Placement(tuple(c.index for c in chosen), tuple(c.free / together for c in chosen), kind)
    return None


def shortfall(need: int, room: Sequence[DeviceRoom], allowed: Collection[int]) -> int:
    """Bytes to free on the ``allowed`` devices before a model of ``need`` bytes fits there together."""
    return need - sum(r.free for r in room if r.index in allowed)


def frees_on(load: Load, node: NodeMemory, allowed: Collection[int]) -> int:
    """Bytes that unloading ``load`` frees on the ``allowed`` devices of ``node``."""
    capacities = _capacities(node)
    whole = sum(capacities)
    return sum(_part(load, d.index, c, whole) for d, c in zip(node.devices, capacities, strict=True)
               if d.index in allowed)


@dataclass(frozen=True)
class ChildDevices:
    """How a child is told its devices.

    Attributes:
        variables: what to set in the child's environment besides a preset's ``*_VISIBLE_DEVICES``
            (llmman.config.presets.device_env): an unpinned child's visible devices (:data:`VISIBLE`).
        split_mode: llama-server's ``--split-mode`` (``none``: one device only), or None.
        main_gpu: ``--main-gpu``, the one visible device used (with ``split_mode`` ``none``), or None.
        tensor_split: ``--tensor-split``, the fraction of the model on each visible device, or ().
    """

    variables: dict[str, str] = field(default_factory=dict)
    split_mode: str | None = None
    main_gpu: int | None = None
    tensor_split: tuple[float, ...] = ()


def child_devices(placement: Placement | None, pin: str | None) -> ChildDevices:
    """The device settings of a child placed at ``placement`` with the preset's ``pin`` (or None).

    Without a placement: nothing (a preset's variables are set as before). Unpinned: the accelerator's
    variable (``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``) names the placement's devices, and a split
    over several gets ``--tensor-split`` in that order. Pinned: only the preset's variables (the child
    numbers its devices 0.. in the pin's order); one device of several is chosen with
    ``--split-mode none --main-gpu K``, a split with ``--tensor-split`` over the pinned devices (0 for
    those not used).
    """
    if placement is None:
        return ChildDevices()
    if pin is None:
        name = VISIBLE.get(placement.kind, VISIBLE["cuda"])
        variables = {name: ",".join(str(d) for d in placement.devices)}
        split = placement.split if len(placement.devices) > 1 else ()
        return ChildDevices(variables, tensor_split=split)
    order = [int(part) for part in pin.split(",")]
    if len(placement.devices) == 1:
        if len(order) == 1:
            return ChildDevices()
        return ChildDevices(split_mode="none", main_gpu=order.index(placement.devices[0]))
    return ChildDevices(tensor_split=tuple(placement.share(d) for d in order))


def device_document(node: NodeMemory | None, models: Iterable[Placed]) -> list[dict[str, Any]]:
    """The ``devices`` list of ``/llmman/node``: per device its index, name, total, the capacity llmman
    offers on it (``memory``), what the loaded ``models`` plan there, the room left (``free``) and which
    models sit on it. A host-only node lists its RAM device (every model sits on it); an unknown node []."""
    if node is None or not node.devices:
        return []
    loads = [Load(m.reference, m.memory, m.placement) for m in models]
    if per_device(node):
        listed = rooms(node, loads)
    else:  # one pool: the capacity and every model on the first device, as the node-wide rule counts them
        first = node.devices[0]
        planned = sum(load.memory for load in loads)
        listed = [DeviceRoom(first.index, first.name, first.total, node.capacity, planned,
                             tuple(dict.fromkeys(load.reference for load in loads)))]
        listed += [DeviceRoom(d.index, d.name, d.total, 0, 0) for d in node.devices[1:]]
    return [{"index": r.index, "name": r.name, "total": r.total, "memory": r.capacity, "planned": r.planned,
             "free": r.free, "models": list(r.models)} for r in listed]
