"""``llmman gpu-discover``: the accelerator, each device's total/free memory, and the figure llmman uses."""

from __future__ import annotations

import argparse

from llmman.cli.tables import format_size
from llmman.config.settings import Settings
from llmman.sched.gpu import node_memory


def cmd_gpu_discover(args: argparse.Namespace, settings: Settings) -> int:
    """Print what discovery finds on this machine (no daemon needed) and the capacity after the
    ``[resources]`` cap and reserve. Returns 0, or 1 when nothing was found (capacity 0)."""
    from llmman.cli.serve_check import check_server_extra

    check_server_extra("llmman gpu-discover")  # without psutil/NVML it would report "unknown"
    node = node_memory(cap=settings.memory, reserve=settings.reserve,
                       environ=settings.environment.visible_devices)
    print(f"accelerator: {node.accelerator}")
    for d in node.devices:
        print(f"  {d.kind}{d.index}: {d.name}: total {format_size(d.total)} ({d.total} bytes), "
              f"free {format_size(d.free)} ({d.free} bytes)")
    if not node.devices:
        print("  no device found")
    origin = settings.origins.get("resources.memory", "default")
    cap = f"{format_size(node.cap)} ({origin})" if node.cap else "none"
    print(f"cap (resources.memory): {cap}")
    print(f"reserve (resources.reserve): {format_size(node.reserve)}")
    print(f"llmman uses: {format_size(node.capacity)} ({node.capacity} bytes)")
    return 0 if node.capacity > 0 else 1
