"""The store lock: concurrent writers (threads, separate Store objects, processes) and gc during builds."""

from __future__ import annotations

import json
import multiprocessing
import threading
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest
from ggufgen import write_gguf
from test_store import validate_layout

from llmman.refs import parse_reference
from llmman.store import Store


def _sources(tmp_path: Path, n: int) -> list[Path]:
    return [write_gguf(tmp_path / f"src{i}" / "m.gguf", context_length=1000 + i) for i in range(n)]


def test_threads_building_concurrently_keep_every_entry(tmp_path: Path) -> None:
    root = tmp_path / "store"
    sources = _sources(tmp_path, 8)
    shared = Store(root)
    barrier = threading.Barrier(len(sources))
    errors: list[BaseException] = []

    def work(i: int) -> None:
        store = shared if i % 2 else Store(root)  # same object (thread lock) and separate ones (flock)
        barrier.wait()
        try:
            store.build(parse_reference(f"m{i}"), sources[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(sources))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    index = json.loads((root / "index.json").read_text())
    names = sorted(e["annotations"]["org.opencontainers.image.ref.name"] for e in index["manifests"])
    assert names == sorted(f"docker.io/ai/m{i}:latest" for i in range(len(sources)))
    for i in range(len(sources)):
        assert shared.info(shared.get(parse_reference(f"m{i}"))).context_length == 1000 + i
    validate_layout(shared)


def test_gc_during_builds_never_loses_blobs(tmp_path: Path) -> None:
    root = tmp_path / "store"
    sources = _sources(tmp_path, 6)
    store = Store(root)
    done = threading.Event()

    def collect() -> None:
        while not done.is_set():
            store.gc()

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        for i, src in enumerate(sources):
            store.build(parse_reference(f"m{i}"), src)
    finally:
        done.set()
        collector.join()
    assert len(store.list()) == len(sources)
    validate_layout(store)


def _build_in_process(root: str, sources: list[str], prefix: str, start: Event) -> None:
    start.wait()
    store = Store(Path(root))
    for i, src in enumerate(sources):
        store.build(parse_reference(f"{prefix}{i}"), Path(src))


@pytest.mark.timeout(120)
def test_processes_building_concurrently(tmp_path: Path) -> None:
    root = tmp_path / "store"
    sources = [str(p) for p in _sources(tmp_path, 6)]
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_build_in_process, args=(str(root), sources[k::2], f"p{k}-", start))
             for k in range(2)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    store = Store(root)
    assert sorted(m.reference for m in store.list()) == sorted(
        [f"docker.io/ai/p0-{i}:latest" for i in range(3)] + [f"docker.io/ai/p1-{i}:latest" for i in range(3)]
    )
    validate_layout(store)
