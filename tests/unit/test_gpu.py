"""Node capacity: NVML replayed from recorded figures, AMD sysfs from a fake tree, the cap and reserve."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from llmman.config.settings import load_settings
from llmman.errors import ConfigError
from llmman.sched.gpu import Device, NodeMemory, amd_devices, discover, node_memory, nvidia_devices
from llmman.sizes import parse_size

GIB = 1024**3


@dataclass
class _Mem:
    total: int
    free: int
    used: int


class RecordedNVML:
    """NVML as nvidia-ml-py exposes it, replaying figures recorded from real cards."""

    def __init__(self, cards: list[tuple[str, int, int]], *, fail_init: bool = False) -> None:
        self.cards = cards
        self.fail_init = fail_init
        self.shutdown = False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.cards[handle][0]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Mem:
        _, total, free = self.cards[handle]
        return _Mem(total, free, total - free)

    def nvmlShutdown(self) -> None:
        self.shutdown = True


# H200: recorded with nvidia-ml-py on a real H200 with nothing loaded (nvidia-smi: 143771 MiB total).
# The second card is synthetic (a 24 GiB card, half used), to check that devices add up.
H200 = ("NVIDIA H200", 150754820096, 150109880320)
SECOND = ("Synthetic 24 GiB card", 25769803776, 12884901888)


def test_nvml_recorded_figures() -> None:
    nvml = RecordedNVML([H200, SECOND])
    devices = nvidia_devices(nvml)
    assert devices == [
        Device("cuda", 0, "NVIDIA H200", 150754820096, 150109880320),
        Device("cuda", 1, "Synthetic 24 GiB card", 25769803776, 12884901888),
    ]
    assert nvml.shutdown
    node = NodeMemory("cuda", tuple(devices), reserve=2 * 10**9)
    assert node.capacity == 150754820096 + 25769803776 - 2 * 10**9


def test_nvml_without_driver_falls_back_to_ram() -> None:
    assert nvidia_devices(RecordedNVML([], fail_init=True)) == []
    accelerator, devices = discover(nvml=lambda: RecordedNVML([], fail_init=True), sysfs=Path("/nonexistent"),
                                    system="linux", environ={})
    assert accelerator == "cpu"
    assert devices[0].total > 0 and devices[0].name == "system RAM"


def test_discover_prefers_nvidia_then_apple() -> None:
    assert discover(nvml=lambda: RecordedNVML([H200]), environ={})[0] == "cuda"
    assert discover(nvml=lambda: None, system="darwin", machine="arm64", environ={})[0] == "metal"


@pytest.mark.parametrize(
    ("variable", "indexes"),
    [
        (None, [0, 1]),  # unset: every card
        ("1", [1]),  # the daemon's children can use only card 1: count only it, under its NVML index
        ("0,1", [0, 1]),
        ("GPU-8f6e0d5a-0000", [0, 1]),  # a UUID is not read: every card, as before
    ],
)
def test_the_daemons_visible_devices_limit_what_is_counted(variable: str | None, indexes: list[int]) -> None:
    environ = {} if variable is None else {"CUDA_VISIBLE_DEVICES": variable}
    accelerator, devices = discover(nvml=lambda: RecordedNVML([H200, SECOND]), environ=environ)
    assert accelerator == "cuda"
    assert [d.index for d in devices] == indexes


def test_no_visible_gpu_falls_back_to_ram() -> None:
    accelerator, _ = discover(nvml=lambda: RecordedNVML([H200]), sysfs=Path("/nonexistent"), system="linux",
                              environ={"CUDA_VISIBLE_DEVICES": ""})
    assert accelerator == "cpu"


def _card(root: Path, name: str, vendor: str, total: int, used: int) -> None:
    dev = root / "class" / "drm" / name / "device"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "mem_info_vram_total").write_text(f"{total}\n")
    (dev / "mem_info_vram_used").write_text(f"{used}\n")


def test_amd_sysfs(tmp_path: Path) -> None:
    _card(tmp_path, "card0", "0x8086", 0, 0)  # an Intel iGPU: not AMD
    _card(tmp_path, "card1", "0x1002", 17163091968, 1073741824)  # Radeon RX 7800 XT, recorded
    (tmp_path / "class" / "drm" / "card1-DP-1").mkdir()  # a connector, not a card
    assert amd_devices(tmp_path) == [Device("rocm", 0, "card1", 17163091968, 17163091968 - 1073741824)]
    assert discover(nvml=lambda: None, sysfs=tmp_path, system="linux", environ={})[0] == "rocm"
    assert discover(nvml=lambda: None, sysfs=tmp_path, system="linux", environ={"HIP_VISIBLE_DEVICES": "1"},
                    )[0] == "cpu"  # the one AMD card is index 0, hidden from the children


@pytest.mark.parametrize(
    ("total", "cap", "reserve", "capacity"),
    [
        (24 * GIB, 0, 0, 24 * GIB),  # no cap: everything
        (24 * GIB, 8 * GIB, 0, 8 * GIB),  # the cap wins when smaller
        (24 * GIB, 64 * GIB, 0, 24 * GIB),  # a cap above the device does not invent memory
        (24 * GIB, 8 * GIB, 1 * GIB, 7 * GIB),  # the reserve comes off the capped figure
        (1 * GIB, 0, 2 * GIB, 0),  # never below zero
    ],
)
def test_capacity(total: int, cap: int, reserve: int, capacity: int) -> None:
    node = node_memory(cap=cap, reserve=reserve, found=("cpu", [Device("cpu", 0, "RAM", total, total)]))
    assert node.capacity == capacity


def test_unknown_node_reports_zero_unless_capped() -> None:
    assert NodeMemory("unknown", ()).capacity == 0
    assert NodeMemory("unknown", (), cap=GIB).capacity == GIB


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("1024", 1024), ("24GB", 24 * 10**9), ("512MiB", 512 * 2**20), ("1.5 GiB", 3 * 2**29),
     ("2gb", 2 * 10**9), (7, 7)],
)
def test_parse_size(text: object, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["-1", "24 parsecs", "", "GB", True, -5, [1]])
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_resources_section_in_the_file(tmp_path: Path) -> None:
    user = tmp_path / "user.conf"
    user.write_text('[resources]\nmemory = "300MB"\nreserve = 1000\n')
    s = load_settings(env={"HOME": str(tmp_path)}, system_file=tmp_path / "none", user_file=user)
    assert (s.memory, s.reserve) == (300 * 10**6, 1000)
    user.write_text("[resources]\nmemory = true\n")
    with pytest.raises(ConfigError, match=r"resources\.memory"):
        load_settings(env={"HOME": str(tmp_path)}, system_file=tmp_path / "none", user_file=user)
    with pytest.raises(ConfigError, match="LLMMAN_MEMORY"):
        load_settings(env={"HOME": str(tmp_path), "LLMMAN_MEMORY": "lots"}, system_file=tmp_path / "none",
                      user_file=tmp_path / "none2")
