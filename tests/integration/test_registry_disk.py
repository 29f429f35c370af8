"""A full disk during a pull: a clear error and a clean store (real registry, real daemon, real CLI).

The store is a 150 MB tmpfs (mounting needs root; CI runs as root); Gemma 3 270M (253 MB) does not fit.
``/api/pull`` and ``llmman pull`` must fail naming "no space left on device", leaving no partial file, no
half blob and the index byte for byte as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmman.errors import StoreError
from llmman.refs import parse_reference
from llmman.registry import splice
from llmman.registry.puller import Puller
from llmman.registry.push import push
from llmman.store import Store
from llmman.store import mediatypes as mt
from tests.integration.daemons import start_daemon
from tests.integration.registry import Registry, available, gemma_file, start_registry

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not available(), reason="docker-registry missing")]
TMPFS_SIZE = "150m"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry holding Gemma 3 270M as ``ai/gemma3:270m``."""
    path = gemma_file()
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    mp = pytest.MonkeyPatch()
    mp.setenv("LLMMAN_INSECURE_REGISTRIES", reg.host)
    ref = parse_reference(f"{reg.host}/ai/gemma3:270m")
    store = Store(tmp_path_factory.mktemp("src") / "store")
    store.build(ref, path)
    push(store, ref, None, lambda _: None)
    mp.undo()
    yield reg
    reg.stop()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/store`` as a tmpfs of :data:`TMPFS_SIZE`, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs for the full-disk test needs root")
    mnt = tmp_path / "store"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _seed(store: Store) -> None:
    """A small model already in the store, so the index has something to keep."""
    data = b"GGUF" + bytes(range(256)) * 16
    layer = store.write_blob([data])
    config = store.write_blob([b"{}"])
    manifest = {"schemaVersion": 2, "mediaType": mt.OCI_MANIFEST,
                "config": {"mediaType": mt.DOCKER_AI_CONFIG, "digest": config, "size": 2},
                "layers": [{"mediaType": mt.DOCKER_AI_GGUF, "digest": layer, "size": len(data)}]}
    store.put_manifest(parse_reference("keep:me"), json.dumps(manifest).encode(), mt.OCI_MANIFEST)


def _assert_clean(store: Store, before: bytes, layer: str) -> None:
    assert store.layout.index_path.read_bytes() == before
    assert not store.layout.blob_path(layer).exists()
    assert not list(store.root.rglob("*.partial")) and not list(store.root.rglob("*.tmp"))


def test_full_disk_is_a_clear_error_and_leaves_the_store_clean(tmp_path: Path, small_disk: Path,
                                                                registry: Registry) -> None:
    name = f"{registry.host}/ai/gemma3:270m"
    gguf = gemma_file()
    layer = "sha256:" + _sha256(gguf)
    store = Store(small_disk)
    _seed(store)
    before = store.layout.index_path.read_bytes()
    node = start_daemon(tmp_path, extra_env={"LLMMAN_INSECURE_REGISTRIES": registry.host})
    try:
        with node.client() as c:
            r = c.post("/api/pull", json={"model": name, "stream": False}, timeout=300)
            assert r.status_code == 507, r.text
            assert "no space left on device" in r.json()["error"]
            _assert_clean(store, before, layer)
            r = c.post("/api/pull", json={"model": name}, timeout=300)
            last = json.loads(r.text.splitlines()[-1])
            assert "no space left on device" in last["error"]
            _assert_clean(store, before, layer)
            names = [m["name"] for m in c.get("/api/tags").json()["models"]]
            assert len(names) == 1 and names[0].endswith("/keep:me")
        env = {**node.env, "LLMMAN_HOST": "127.0.0.1:1"}  # no daemon: the CLI pulls into the store itself
    finally:
        node.stop(signal.SIGTERM)
    out = subprocess.run([sys.executable, "-m", "llmman", "--store", str(small_disk), "pull", name], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "no space left on device" in out.stderr
    _assert_clean(store, before, layer)


def test_full_disk_on_the_buffered_path_too(small_disk: Path, registry: Registry,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # The path TLS registries take (no splice): the writer thread's ENOSPC must surface the same way.
    monkeypatch.setattr(splice, "usable", lambda *_: False)
    monkeypatch.setenv("LLMMAN_INSECURE_REGISTRIES", registry.host)
    store = Store(small_disk)
    _seed(store)
    before = store.layout.index_path.read_bytes()
    with pytest.raises(StoreError, match="no space left on device") as caught:
        Puller(store).pull(parse_reference(f"{registry.host}/ai/gemma3:270m"))
    assert caught.value.status == 507
    _assert_clean(store, before, "sha256:" + _sha256(gemma_file()))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
