"""How much memory this node can give to models: accelerator discovery and the capacity figure.

Sources, first that answers wins: NVIDIA through NVML (``nvidia-ml-py``: ``nvmlDeviceGetMemoryInfo``),
AMD through sysfs (``/sys/class/drm/card*/device/mem_info_vram_total`` / ``_used``, vendor ``0x1002``),
Apple Silicon (unified memory: system RAM), else the CPU (system RAM from ``psutil``). A source that
fails (no driver, no permission) is skipped; when nothing answers the capacity is 0. A daemon started with
``CUDA_VISIBLE_DEVICES`` (NVIDIA) or ``HIP_VISIBLE_DEVICES`` (AMD) set to indexes counts only those devices,
as its children can use no other (:func:`visible`); the indexes stay the driver's.

The figure the scheduler uses (:attr:`NodeMemory.capacity`, bytes) is
``min(total of the devices, [resources] memory when set) - [resources] reserve``, never below 0.
Every function takes its sources as arguments so that tests replay recorded figures.

Telemetry (the dashboard's and ``/metrics``' per-device figures, :func:`telemetry`): utilisation, temperature,
power and memory used per GPU, from NVML (``nvmlDeviceGetUtilizationRates``, ``nvmlDeviceGetTemperature``,
``nvmlDeviceGetPowerUsage``) or AMD's sysfs (``gpu_busy_percent``, ``hwmon*/temp1_input``,
``hwmon*/power1_average``); a figure a device does not report is None; CPU and Apple nodes have none.
Reads are cached for :data:`TELEMETRY_TTL_S` (peers ask ``/llmman/node`` often).
"""

from __future__ import annotations

import platform
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Device", "NodeMemory", "Telemetry", "amd_devices", "amd_telemetry", "discover", "host_devices",
           "node_memory", "nvidia_devices", "nvidia_telemetry", "telemetry", "visible"]

AMD_VENDOR = "0x1002"
TELEMETRY_TTL_S = 1.0


@dataclass(frozen=True)
class Device:
    """One memory pool models can be loaded into.

    Attributes:
        kind: ``cuda``, ``rocm``, ``metal`` or ``cpu``.
        index: the device's index for its driver (``CUDA_VISIBLE_DEVICES`` numbering), 0 for RAM.
        name: what the driver calls it (``NVIDIA H200``, ``card0``, ``system RAM``).
        total: bytes of memory.
        free: bytes free now, as the driver reports.
    """

    kind: str
    index: int
    name: str
    total: int
    free: int


@dataclass(frozen=True)
class NodeMemory:
    """The node's accelerator, its devices and the capacity llmman offers (bytes).

    Attributes:
        accelerator: ``cuda``, ``rocm``, ``metal``, ``cpu`` or ``unknown``.
        devices: what discovery found.
        cap: the ``[resources] memory`` cap in bytes, 0 = none.
        reserve: ``[resources] reserve`` bytes kept back.
    """

    accelerator: str
    devices: tuple[Device, ...]
    cap: int = 0
    reserve: int = 0

    @property
    def total(self) -> int:
        """Bytes of all devices together."""
        return sum(d.total for d in self.devices)

    @property
    def free(self) -> int:
        """Bytes the drivers report free now."""
        return sum(d.free for d in self.devices)

    @property
    def capacity(self) -> int:
        """Bytes llmman may fill with models: ``min(total, cap or total) - reserve``, at least 0.

        With a cap and no device found (``unknown``), the cap alone is the capacity.
        """
        base = self.total
        if self.cap > 0:
            base = min(base, self.cap) if self.devices else self.cap
        return max(0, base - self.reserve)


def nvidia_devices(nvml: Any) -> list[Device]:
    """NVIDIA GPUs through an NVML module (``pynvml`` from nvidia-ml-py, or a recorded stand-in).

    Returns [] when NVML cannot initialise (no driver) or reports no device.
    """
    try:
        nvml.nvmlInit()
    except Exception:
        return []
    try:
        out = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            text = name.decode() if isinstance(name, bytes) else str(name)
            out.append(Device("cuda", i, text, int(mem.total), int(mem.free)))
        return out
    except Exception:
        return []
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _amd_cards(sysfs: Path) -> list[Path]:
    """``class/drm/cardN`` entries, in sysfs order (AMD's device indexes count the AMD ones among them)."""
    drm = sysfs / "class" / "drm"
    try:
        return sorted(p for p in drm.iterdir() if p.name.startswith("card") and p.name[4:].isdigit())
    except OSError:
        return []


def amd_devices(sysfs: Path = Path("/sys")) -> list[Device]:
    """AMD GPUs from sysfs: each ``class/drm/cardN/device`` with vendor ``0x1002`` and VRAM files."""
    out: list[Device] = []
    for card in _amd_cards(sysfs):
        dev = card / "device"
        try:
            if (dev / "vendor").read_text().strip() != AMD_VENDOR:
                continue
            total = int((dev / "mem_info_vram_total").read_text())
            used = int((dev / "mem_info_vram_used").read_text())
        except (OSError, ValueError):
            continue
        if total > 0:
            out.append(Device("rocm", len(out), card.name, total, max(0, total - used)))
    return out


def _load_nvml() -> Any:
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError:
        return None
    return pynvml


@dataclass(frozen=True)
class Telemetry:
    """What a GPU reports of itself now; None where it reports nothing.

    Attributes:
        index: the driver's index (as :class:`Device` numbers it).
        used: bytes of memory in use (by any process).
        utilisation: percent of the time the GPU was busy over the driver's last sample.
        temperature: degrees Celsius.
        power: watts drawn.
    """

    index: int
    used: int | None = None
    utilisation: float | None = None
    temperature: float | None = None
    power: float | None = None


def _read(read: Callable[..., Any], *args: Any) -> Any:
    """``read(*args)``, or None when the driver does not give that figure."""
    try:
        return read(*args)
    except Exception:
        return None


def nvidia_telemetry(nvml: Any) -> list[Telemetry]:
    """Each NVIDIA GPU's figures through NVML (initialised here and left so: the reads repeat).

    Returns [] when NVML cannot initialise or count its devices.
    """
    try:
        nvml.nvmlInit()
        count = int(nvml.nvmlDeviceGetCount())
    except Exception:
        return []
    out = []
    for i in range(count):
        handle = _read(nvml.nvmlDeviceGetHandleByIndex, i)
        if handle is None:
            continue
        mem = _read(nvml.nvmlDeviceGetMemoryInfo, handle)
        rates = _read(nvml.nvmlDeviceGetUtilizationRates, handle)
        temp = _read(nvml.nvmlDeviceGetTemperature, handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
        milliwatts = _read(nvml.nvmlDeviceGetPowerUsage, handle)
        out.append(Telemetry(i, used=int(mem.used) if mem is not None else None,
                             utilisation=float(rates.gpu) if rates is not None else None,
                             temperature=float(temp) if temp is not None else None,
                             power=milliwatts / 1000 if milliwatts is not None else None))
    return out


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def amd_telemetry(sysfs: Path = Path("/sys")) -> list[Telemetry]:
    """Each AMD GPU's figures from sysfs, indexed as :func:`amd_devices` numbers them."""
    out: list[Telemetry] = []
    for card in _amd_cards(sysfs):
        dev = card / "device"
        try:
            vendor = (dev / "vendor").read_text().strip()
        except OSError:
            continue
        if vendor != AMD_VENDOR or not _number(dev / "mem_info_vram_total"):
            continue
        try:
            hwmon = sorted((dev / "hwmon").iterdir())
        except OSError:
            hwmon = []
        temps = [t for h in hwmon if (t := _number(h / "temp1_input")) is not None]
        watts = [w for h in hwmon for name in ("power1_average", "power1_input")
                 if (w := _number(h / name)) is not None]
        busy = _number(dev / "gpu_busy_percent")
        out.append(Telemetry(len(out), used=_number(dev / "mem_info_vram_used"),
                             utilisation=float(busy) if busy is not None else None,
                             temperature=temps[0] / 1000 if temps else None,
                             power=watts[0] / 1_000_000 if watts else None))
    return out


class _Cached:
    """The last telemetry read per accelerator, reused for :data:`TELEMETRY_TTL_S`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.read: dict[str, tuple[float, dict[int, Telemetry]]] = {}


_CACHE = _Cached()


def telemetry(accelerator: str, *, nvml: Callable[[], Any] = _load_nvml, sysfs: Path = Path("/sys"),
              clock: Callable[[], float] = time.monotonic, cache: _Cached | None = _CACHE,
              ) -> dict[int, Telemetry]:
    """This node's GPU figures by device index: NVML on ``cuda``, sysfs on ``rocm``, none otherwise."""
    if accelerator not in ("cuda", "rocm"):
        return {}
    now = clock()
    if cache is not None:
        with cache.lock:
            seen = cache.read.get(accelerator)
            if seen is not None and now - seen[0] < TELEMETRY_TTL_S:
                return seen[1]
    found: list[Telemetry] = []
    if accelerator == "rocm":
        found = amd_telemetry(sysfs)
    elif (module := nvml()) is not None:
        found = nvidia_telemetry(module)
    figures = {t.index: t for t in found}
    if cache is not None:
        with cache.lock:
            cache.read[accelerator] = (now, figures)
    return figures


#: A cgroup v1 ``memory.limit_in_bytes`` at or above this is "no limit" (the kernel writes 2**63 - 4096).
CGROUP_UNLIMITED = 1 << 62


def _cgroup_number(path: Path) -> int | None:
    """The number in a cgroup file, None when absent, unreadable, ``max`` or "unlimited"."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # "max" (v2): no limit here
    value = int(text)
    return value if value < CGROUP_UNLIMITED else None


def cgroup_memory(self_cgroup: Path = Path("/proc/self/cgroup"),
                  root: Path = Path("/sys/fs/cgroup")) -> tuple[int, int] | None:
    """``(limit, usage)`` in bytes of the memory cgroup this process is in, the tightest limit of it and its
    ancestors that llmman can see (a container's, a systemd unit's ``MemoryMax``, a Kubernetes pod's
    ``resources.limits.memory``); None when no limit applies or none can be read. cgroup v2
    (``memory.max``, ``memory.current``) and v1 (``memory.limit_in_bytes``, ``memory.usage_in_bytes``)."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    best: tuple[int, int] | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, path = parts[1].split(","), parts[2].strip()
        if parts[0] == "0" and parts[1] == "":
            base, limit_file, usage_file = root, "memory.max", "memory.current"
            if not (root / "cgroup.controllers").exists() and (root / "unified").is_dir():
                base = root / "unified"  # a hybrid host: v2 mounted beside v1
        elif "memory" in controllers:
            base, limit_file, usage_file = root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        # The process's own group, then each ancestor up to the mount's root; inside a container with its
        # own cgroup namespace the path is "/" and the mount's root is the container's group.
        group = base / path.lstrip("/")
        for where in (group, *[p for p in group.parents if p.is_relative_to(base)]):
            limit = _cgroup_number(where / limit_file)
            if limit is not None and (best is None or limit < best[0]):
                best = (limit, _cgroup_number(where / usage_file) or 0)
    return best


def host_devices(kind: str = "cpu", limit: tuple[int, int] | None = None) -> list[Device]:
    """System RAM as one device (``cpu``, or ``metal`` for Apple Silicon's unified memory), no more than the
    memory cgroup allows (:func:`cgroup_memory`, read when ``limit`` is None): a container or unit limited to
    8 GB is an 8 GB node, whatever the host has."""
    import psutil  # here, so that NVML discovery works without it

    vm = psutil.virtual_memory()
    name = "unified memory" if kind == "metal" else "system RAM"
    total, available = int(vm.total), int(vm.available)
    limit = limit if limit is not None else cgroup_memory()
    if limit is not None and limit[0] < total:
        total, available = limit[0], min(available, max(0, limit[0] - limit[1]))
        name += f" (cgroup limit {limit[0]} bytes)"
    return [Device(kind, 0, name, total, available)]


def visible(devices: list[Device], variable: str | None) -> list[Device]:
    """The ``devices`` a ``*_VISIBLE_DEVICES`` value lets through: all when unset or not a list of indexes
    (UUIDs, MIG names: not read), none when empty, else those with the listed indexes."""
    if variable is None:
        return devices
    if not variable.strip():
        return []
    try:
        wanted = {int(part) for part in variable.split(",")}
    except ValueError:
        return devices
    return [d for d in devices if d.index in wanted]


def discover(
    *,
    nvml: Callable[[], Any] = _load_nvml,
    sysfs: Path = Path("/sys"),
    system: str = sys.platform,
    machine: str = platform.machine(),
    environ: Mapping[str, str] | None = None,
) -> tuple[str, list[Device]]:
    """Find the accelerator and its devices: ``(accelerator, devices)``; ``("unknown", [])`` if none.
    ``environ`` holds the daemon's visible-devices variables (Settings.environment.visible_devices; see
    :func:`visible`); None = no limit."""
    module = nvml()
    environ = environ or {}
    cuda, hip = environ.get("CUDA_VISIBLE_DEVICES"), environ.get("HIP_VISIBLE_DEVICES")
    if module is not None and (found := visible(nvidia_devices(module), cuda)):
        return "cuda", found
    if system.startswith("linux") and (found := visible(amd_devices(sysfs), hip)):
        return "rocm", found
    try:
        if system == "darwin" and machine == "arm64":
            return "metal", host_devices("metal")
        return "cpu", host_devices("cpu")
    except Exception:
        return "unknown", []


def node_memory(
    *, cap: int = 0, reserve: int = 0, found: tuple[str, list[Device]] | None = None,
    environ: Mapping[str, str] | None = None,
) -> NodeMemory:
    """Discover (unless ``found`` is given; ``environ`` as :func:`discover` takes it) and apply the
    ``[resources]`` cap and reserve (bytes)."""
    accelerator, devices = found if found is not None else discover(environ=environ)
    return NodeMemory(accelerator, tuple(devices), cap=cap, reserve=reserve)
