"""GPU telemetry (llmman.sched.gpu.telemetry): NVML's calls answered with an H200's shapes, AMD's sysfs
from a tree laid out as amdgpu lays it, the one-second cache, and where the figures go: the ``devices`` of
``/llmman/node`` (llmman.cluster.state.with_telemetry) and the ``llmman_gpu_*`` families of ``/metrics``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.unit.test_gpu import _card

import llmman.cluster.state
import llmman.obs.metrics
from llmman.cluster.state import with_telemetry
from llmman.obs.metrics import Metrics
from llmman.sched.gpu import (
    Device,
    NodeMemory,
    Telemetry,
    amd_telemetry,
    nvidia_telemetry,
    telemetry,
)
from llmman.sched.scheduler import Scheduler


@dataclass
class _Mem:
    total: int
    free: int
    used: int


@dataclass
class _Rates:
    gpu: int
    memory: int


class RecordedNVML:
    """NVML's telemetry calls as nvidia-ml-py exposes them (the H200's memory total as recorded in
    tests/unit/test_gpu.py; utilisation, temperature, power and 70 GiB used are synthetic, in NVML's units:
    percent, degrees, milliwatts); the second card's power read fails as an unsupported one does."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Mem:
        return _Mem(150754820096, 150754820096 - 75161927680, 75161927680)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Rates:
        return _Rates(87 if handle == 0 else 3, 40)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 41

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        if handle == 1:
            raise RuntimeError("Not Supported")
        return 312500  # milliwatts


def test_nvml_figures() -> None:
    got = nvidia_telemetry(RecordedNVML())
    assert got == [Telemetry(0, used=75161927680, utilisation=87.0, temperature=41.0, power=312.5),
                   Telemetry(1, used=75161927680, utilisation=3.0, temperature=41.0, power=None)]


def test_nvml_without_driver_gives_nothing() -> None:
    class NoDriver(RecordedNVML):
        def nvmlInit(self) -> None:
            raise RuntimeError("NVML Shared Library Not Found")

    assert nvidia_telemetry(NoDriver()) == []


def test_amd_sysfs(tmp_path: Path) -> None:
    _card(tmp_path, "card0", "0x8086", 0, 0)  # an Intel iGPU: not counted
    _card(tmp_path, "card1", "0x1002", 17163091968, 1073741824)
    dev = tmp_path / "class" / "drm" / "card1" / "device"
    (dev / "gpu_busy_percent").write_text("64\n")
    (dev / "hwmon" / "hwmon3").mkdir(parents=True)
    (dev / "hwmon" / "hwmon3" / "temp1_input").write_text("52000\n")  # millidegrees
    (dev / "hwmon" / "hwmon3" / "power1_average").write_text("187000000\n")  # microwatts
    _card(tmp_path, "card2", "0x1002", 8589934592, 0)  # no busy, hwmon: figures absent
    assert amd_telemetry(tmp_path) == [
        Telemetry(0, used=1073741824, utilisation=64.0, temperature=52.0, power=187.0),
        Telemetry(1, used=0)]


def test_cpu_and_apple_nodes_have_none_and_reads_are_cached() -> None:
    nvml = RecordedNVML()
    now = [100.0]
    assert telemetry("cpu", nvml=lambda: nvml, cache=None) == {}
    assert telemetry("metal", nvml=lambda: nvml, cache=None) == {}
    assert nvml.inits == 0
    cache = type(llmman.sched.gpu._CACHE)()
    for _ in range(3):
        assert telemetry("cuda", nvml=lambda: nvml, clock=lambda: now[0], cache=cache)[0].power == 312.5
    assert nvml.inits == 1  # read once within the TTL
    now[0] += 1.5
    telemetry("cuda", nvml=lambda: nvml, clock=lambda: now[0], cache=cache)
    assert nvml.inits == 2
    assert telemetry("cuda", nvml=lambda: None, cache=None) == {}  # no nvidia-ml-py


def recorded(accelerator: str) -> dict[int, Telemetry]:
    return {t.index: t for t in nvidia_telemetry(RecordedNVML())} if accelerator == "cuda" else {}


H200 = NodeMemory("cuda", (Device("cuda", 0, "NVIDIA H200", 150754820096, 75592892416),
                           Device("cuda", 1, "NVIDIA H200", 150754820096, 75592892416)))


def test_the_node_documents_devices_carry_the_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llmman.cluster.state, "telemetry", recorded)
    devices: list[dict[str, Any]] = [{"index": 0, "name": "NVIDIA H200"}, {"index": 1, "name": "NVIDIA H200"}]
    got = with_telemetry(devices, H200)
    assert got[0] == {"index": 0, "name": "NVIDIA H200", "used": 75161927680, "utilisation": 87.0,
                      "temperature": 41.0, "power": 312.5}
    assert "power" not in got[1] and got[1]["utilisation"] == 3.0
    cpu = NodeMemory("cpu", (Device("cpu", 0, "system RAM", 10**10, 10**9),))
    assert with_telemetry([{"index": 0, "name": "system RAM"}], cpu) == [{"index": 0, "name": "system RAM"}]
    assert with_telemetry([], None) == []


async def test_metrics_export_the_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llmman.obs.metrics, "telemetry", recorded)

    async def never(*_: object) -> Any:
        raise AssertionError("nothing is loaded in this test")

    scheduler = Scheduler(never, default_keep_alive=300, capacity=10**11,  # type: ignore[arg-type]
                          node_memory=H200)
    metrics = Metrics(node="spark")
    metrics.watch(scheduler)
    try:
        out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(metrics.exposition([]).decode()):
            for s in family.samples:
                out[s.name, frozenset(s.labels.items())] = s.value
        labels = frozenset({"node": "spark", "device": "0", "name": "NVIDIA H200"}.items())
        assert out["llmman_gpu_utilisation_percent", labels] == 87.0
        assert out["llmman_gpu_temperature_celsius", labels] == 41.0
        assert out["llmman_gpu_power_watts", labels] == 312.5
        assert out["llmman_gpu_memory_used_bytes", labels] == 75161927680
        assert out["llmman_gpu_memory_total_bytes", labels] == 150754820096
        second = frozenset({"node": "spark", "device": "1", "name": "NVIDIA H200"}.items())
        assert ("llmman_gpu_power_watts", second) not in out
        assert out["llmman_gpu_utilisation_percent", second] == 3
    finally:
        await scheduler.close()
