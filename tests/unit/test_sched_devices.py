"""Per-device placement inside one node (llmman.sched.devices), table-tested with fake devices: room per
device, the choice of one device or a split, pins, the child's device flags and the ``/llmman/node`` list."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from llmman.daemon import launch_spec
from llmman.runner import build_argv
from llmman.sched.devices import (
    ChildDevices,
    DeviceRoom,
    Load,
    Placement,
    allowed_devices,
    child_devices,
    device_document,
    frees_on,
    per_device,
    place,
    rooms,
    shortfall,
)
from llmman.sched.gpu import Device, NodeMemory
from llmman.sched.plan import ModelPlan

G = 10**9


def gpus(*totals: int, accelerator: str = "cuda", reserve: int = 0, cap: int = 0) -> NodeMemory:
    """A node with one fake GPU per total (GB), indexes 0.., nothing used."""
    devices = tuple(Device(accelerator, i, f"GPU{i}", t * G, t * G) for i, t in enumerate(totals))
    return NodeMemory(accelerator, devices, cap=cap, reserve=reserve)


def planned(node: NodeMemory, *loads: tuple[int, int]) -> list[DeviceRoom]:
    """``node``'s rooms with one model of ``gb`` GB wholly on device ``index`` per ``(index, gb)``."""
    whole = [Load(f"m{i}", gb * G, Placement((index,), (1.0,))) for i, (index, gb) in enumerate(loads)]
    return rooms(node, whole)


@pytest.mark.parametrize(
    ("totals", "loads", "pin", "need", "expected"),
    [
        # Two GPUs of different sizes, both empty: the one with most room.
        ((24, 80), (), None, 10, Placement((1,), (1.0,))),
        # The big one nearly full (5 GB left): the small one.
        ((24, 80), ((1, 75),), None, 10, Placement((0,), (1.0,))),
        # Equal room: the lower index.
        ((24, 24), (), None, 10, Placement((0,), (1.0,))),
        # Pinned to the nearly full device: it does not fit there, whatever the other has.
        ((24, 80), ((1, 75),), (1,), 10, None),
        # Pinned to the device with room: there, though the other has more.
        ((24, 80), (), (0,), 10, Placement((0,), (1.0,))),
        # Fits no single device (24 and 20 free) but both together: a split in proportion to their room.
        ((24, 80), ((1, 60),), None, 30, Placement((0, 1), (24 / 44, 20 / 44))),
        # Three devices: the fewest that hold it, most room first (20 + 15 GB; the 10 GB one stays free).
        ((20, 15, 10), (), None, 30, Placement((0, 1), (20 / 35, 15 / 35))),
        # A split only among the pinned devices.
        ((20, 15, 10), (), (1, 2), 20, Placement((1, 2), (15 / 25, 10 / 25))),
        # Not even all of them together.
        ((24, 80), ((1, 60),), None, 50, None),
        # A model of unknown size (0) goes where there is most room.
        ((24, 80), ((1, 75),), None, 0, Placement((0,), (1.0,))),
    ],
)
def test_place(totals: tuple[int, ...], loads: tuple[tuple[int, int], ...], pin: tuple[int, ...] | None,
               need: int, expected: Placement | None) -> None:
    node = gpus(*totals)
    room = planned(node, *loads)
    allowed = pin if pin is not None else tuple(range(len(totals)))
    got = place(need * G, room, allowed)
    assert got == (None if expected is None else Placement(expected.devices, pytest.approx(expected.split)))
    if got is not None:  # each part fits its device's room
        for index, fraction in zip(got.devices, got.split, strict=True):
            assert need * G * fraction <= room[index].free
    else:
        assert shortfall(need * G, room, allowed) > 0 or len(allowed) < len(totals)


def test_each_device_offers_its_share_of_the_capacity() -> None:
    node = gpus(24, 8, reserve=4 * G)  # 32 GB, 4 GB held back: 28 GB, shared 3:1
    assert [r.capacity for r in rooms(node, [])] == [21 * G, 7 * G]
    capped = gpus(24, 8, cap=16 * G)
    assert [r.capacity for r in rooms(capped, [])] == [12 * G, 4 * G]
    assert sum(r.capacity for r in rooms(capped, [])) == capped.capacity


def test_what_is_planned_on_each_device() -> None:
    node = gpus(24, 8)
    loads = [
        Load("whole", 6 * G, Placement((1,), (1.0,))),
        Load("split", 8 * G, Placement((0, 1), (0.75, 0.25))),
        Load("unplaced", 4 * G, None),  # admitted without a placement: in proportion to each capacity
    ]
    room = rooms(node, loads)
    assert [r.planned for r in room] == [6 * G + 3 * G, 6 * G + 2 * G + 1 * G]
    assert [r.models for r in room] == [("split", "unplaced"), ("whole", "split", "unplaced")]
    assert [r.free for r in room] == [15 * G, 0]  # device 1 is over-full: no room, never negative
    assert frees_on(loads[1], node, (1,)) == 2 * G
    assert frees_on(loads[1], node, (0, 1)) == 8 * G
    assert frees_on(loads[0], node, (0,)) == 0


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (gpus(24, 80), True),
        (gpus(16, accelerator="rocm"), True),
        (gpus(24, accelerator="cpu"), False),  # host-only: one pool of RAM, the node-wide rule
        (gpus(24, accelerator="metal"), False),
        (NodeMemory("unknown", ()), False),  # nothing found: no limit, as before
        (NodeMemory("unknown", (), cap=8 * G), False),  # a cap and no device: the node-wide cap
        (gpus(1, reserve=2 * G), False),  # capacity 0 means no limit, node-wide
        (None, False),
    ],
)
def test_per_device_only_on_gpu_nodes(node: NodeMemory | None, expected: bool) -> None:
    assert per_device(node) is expected


@pytest.mark.parametrize(
    ("pin", "allowed"),
    [
        (None, (0, 1, 2)),
        ("1", (1,)),
        ("2,0", (2, 0)),  # the pin's order: the child numbers its devices so
        ("1,1", (1,)),
        ("GPU-8f6e0d5a-1c2b", None),  # a UUID: not placed, admitted node-wide
        ("3", None),  # an index this node has not
        ("", None),
    ],
)
def test_allowed_devices(pin: str | None, allowed: tuple[int, ...] | None) -> None:
    assert allowed_devices(rooms(gpus(8, 8, 8), []), pin) == allowed


@pytest.mark.parametrize(
    ("placement", "pin", "expected"),
    [
        (None, None, ChildDevices()),  # not placed: the daemon's environment as it is
        (None, "GPU-x", ChildDevices()),  # a pin not understood: only the preset's variables, as before
        (Placement((1,), (1.0,)), None, ChildDevices({"CUDA_VISIBLE_DEVICES": "1"})),  # unpinned: its device
        (Placement((2, 0), (0.6, 0.4)), None, ChildDevices({"CUDA_VISIBLE_DEVICES": "2,0"},
                                                           tensor_split=(0.6, 0.4))),
        (Placement((1,), (1.0,), "rocm"), None, ChildDevices({"HIP_VISIBLE_DEVICES": "1"})),
        (Placement((1,), (1.0,)), "1", ChildDevices()),  # pinned to one: the preset's variables alone
        (Placement((2,), (1.0,)), "0,2", ChildDevices(split_mode="none", main_gpu=1)),
        (Placement((2, 0), (0.6, 0.4)), "0,2", ChildDevices(tensor_split=(0.4, 0.6))),
        (Placement((1, 2), (0.5, 0.5)), "0,1,2", ChildDevices(tensor_split=(0.0, 0.5, 0.5))),
    ],
)
def test_child_devices(placement: Placement | None, pin: str | None, expected: ChildDevices) -> None:
    assert child_devices(placement, pin) == expected


def _plan(pin: str | None, placement: Placement | None) -> ModelPlan:
    return ModelPlan("docker.io/ai/a:1", "sha256:" + "0" * 64, 100, 512, model_path="/m/a.gguf",
                     devices=pin, placement=placement)


@pytest.mark.parametrize(
    ("pin", "placement", "flags"),
    [
        (None, None, []),
        (None, Placement((1,), (1.0,)), []),  # the visible-devices variable does it all
        (None, Placement((0, 1), (0.75, 0.25)), ["-ts", "0.75,0.25"]),
        ("0,1", Placement((1,), (1.0,)), ["-sm", "none", "-mg", "1"]),
        ("0,1", Placement((1, 0), (0.75, 0.25)), ["-ts", "0.25,0.75"]),
    ],
)
def test_a_placed_plan_gets_the_device_flags(pin: str | None, placement: Placement | None,
                                             flags: list[str]) -> None:
    argv = build_argv("llama-server", launch_spec(_plan(pin, placement)), host="127.0.0.1", port=1)
    assert argv[argv.index("--log-verbosity") + 2:] == flags
    assert launch_spec(_plan(pin, placement)).model_path == Path("/m/a.gguf")


@dataclass(frozen=True)
class _Snap:
    reference: str
    memory: int
    placement: Placement | None


def test_device_document_on_a_gpu_node() -> None:
    node = gpus(24, 80)
    snaps = [_Snap("a", 10 * G, Placement((1,), (1.0,))), _Snap("b", 30 * G, Placement((0, 1), (0.5, 0.5)))]
    assert device_document(node, snaps) == [
        {"index": 0, "name": "GPU0", "total": 24 * G, "memory": 24 * G, "planned": 15 * G, "free": 9 * G,
         "models": ["b"]},
        {"index": 1, "name": "GPU1", "total": 80 * G, "memory": 80 * G, "planned": 25 * G, "free": 55 * G,
         "models": ["a", "b"]},
    ]


def test_device_document_host_only_and_unknown() -> None:
    ram = NodeMemory("cpu", (Device("cpu", 0, "system RAM", 32 * G, 20 * G),), cap=8 * G)
    assert device_document(ram, [_Snap("a", 3 * G, None)]) == [
        {"index": 0, "name": "system RAM", "total": 32 * G, "memory": 8 * G, "planned": 3 * G, "free": 5 * G,
         "models": ["a"]},
    ]
    assert device_document(NodeMemory("unknown", ()), [_Snap("a", 3 * G, None)]) == []
    assert device_document(None, []) == []
