"""A daemon in a memory cgroup plans with the cgroup's limit, not the host's RAM: a real cgroup (v1 or v2,
whichever this machine has) made under this process's own, with a 1 GiB limit, and ``llmman gpu-discover``
run inside it. Skipped where cgroups cannot be written (not root, a read-only cgroup mount)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmman.sched.gpu import cgroup_memory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LIMIT = 1 << 30


def own_group() -> tuple[Path, str] | None:
    """This process's memory cgroup directory and the file that limits it."""
    root = Path("/sys/fs/cgroup")
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return root / "memory" / path.lstrip("/"), "memory.limit_in_bytes"
        if hierarchy == "0" and controllers == "" and (root / "cgroup.controllers").exists():
            return root / path.lstrip("/"), "memory.max"
    return None


@pytest.fixture
def limited_group() -> Iterator[Path]:
    found = own_group()
    if os.geteuid() != 0 or found is None:
        pytest.skip("needs root and a memory cgroup")
    parent, limit_file = found
    group = parent / f"llmman-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / limit_file).write_text(str(LIMIT))
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        yield group
    finally:
        with contextlib.suppress(OSError):
            group.rmdir()  # empty again once the command inside has exited


def test_gpu_discover_inside_a_limited_cgroup_reports_the_limit(limited_group: Path, tmp_path: Path) -> None:
    outside = cgroup_memory()
    assert outside is None or outside[0] > LIMIT  # else this test would prove nothing
    script = f'echo $$ > {limited_group}/cgroup.procs && exec "$0" -m llmman gpu-discover'
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_"))}
    inside = subprocess.run(["sh", "-c", script, sys.executable], capture_output=True, text=True, timeout=60,
                            env=env | {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert inside.returncode == 0, inside.stderr
    used = next(line for line in inside.stdout.splitlines() if line.startswith("llmman uses:"))
    assert used.endswith(f"({LIMIT} bytes)"), inside.stdout  # no [resources] cap: the cgroup's limit is it
    assert f"cgroup limit {LIMIT} bytes" in inside.stdout, inside.stdout
