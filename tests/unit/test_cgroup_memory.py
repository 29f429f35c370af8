"""The memory cgroup caps the host's RAM as llmman plans with it (llmman.sched.gpu.cgroup_memory): cgroup v2
and v1 trees written under tmp_path, the way the kernel lays them out."""

from __future__ import annotations

from pathlib import Path

from llmman.sched.gpu import cgroup_memory, host_devices

GIB = 1 << 30


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def test_v2_takes_the_tightest_limit_of_the_group_and_its_ancestors(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpu memory")
    write(tmp_path / "self", "0::/system.slice/llmman.service")
    write(root / "system.slice/memory.max", str(6 * GIB))
    write(root / "system.slice/memory.current", str(3 * GIB))
    write(root / "system.slice/llmman.service/memory.max", "max")
    write(root / "system.slice/llmman.service/memory.current", str(GIB))
    assert cgroup_memory(tmp_path / "self", root) == (6 * GIB, 3 * GIB)
    write(root / "system.slice/llmman.service/memory.max", str(2 * GIB))
    assert cgroup_memory(tmp_path / "self", root) == (2 * GIB, GIB)


def test_a_container_with_its_own_namespace_reads_the_mount_root(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "memory")
    write(tmp_path / "self", "0::/")
    write(root / "memory.max", str(8 * GIB))
    write(root / "memory.current", str(GIB))
    assert cgroup_memory(tmp_path / "self", root) == (8 * GIB, GIB)


def test_v1_memory_controller_and_its_unlimited_value(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    write(tmp_path / "self", "12:pids:/x\n4:memory:/docker/abc\n1:name=systemd:/docker/abc")
    write(root / "memory/docker/abc/memory.limit_in_bytes", "9223372036854771712")  # no limit
    write(root / "memory/docker/abc/memory.usage_in_bytes", "100")
    assert cgroup_memory(tmp_path / "self", root) is None
    write(root / "memory/docker/abc/memory.limit_in_bytes", str(4 * GIB))
    assert cgroup_memory(tmp_path / "self", root) == (4 * GIB, 100)


def test_no_limit_or_nothing_readable_is_none(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    assert cgroup_memory(tmp_path / "missing", root) is None
    write(tmp_path / "self", "0::/user.slice")
    write(root / "cgroup.controllers", "memory")
    write(root / "user.slice/memory.max", "max")
    assert cgroup_memory(tmp_path / "self", root) is None


def test_the_host_device_is_no_larger_than_the_limit() -> None:
    (whole,) = host_devices("cpu", limit=None)
    assert whole.total > GIB  # the machines this runs on have more than 1 GiB and no limit below it
    (capped,) = host_devices("cpu", limit=(GIB, GIB // 4))
    assert capped.total == GIB and 0 < capped.free <= GIB - GIB // 4 and "cgroup limit" in capped.name
    (roomy,) = host_devices("cpu", limit=(whole.total * 4, 0))
    assert roomy.total == whole.total and "cgroup" not in roomy.name
