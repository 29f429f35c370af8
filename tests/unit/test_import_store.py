"""Importing into a real store (tiny synthetic GGUFs): no second copy, idempotence, names kept, what a
changed or missing source does, ``rm`` leaves the user's file.

The reference case needs a second file system: the store goes on ``/dev/shm`` (tmpfs) while the source
stays under the test's temp folder; skipped where both are one file system.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.ggufgen import write_gguf
from tests.user_stores import hf_cache, ollama_store

from llmman.errors import BadRequest, StoreError
from llmman.refs import parse_reference
from llmman.store import Store, read_extras
from llmman.store.imports import discover, import_all
from llmman.store.model import layer_role


def _flip_last_byte(path: Path) -> None:
    with path.open("r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))


@pytest.fixture
def other_fs_store(tmp_path: Path) -> Iterator[Store]:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the temp folder")
    root = shm / f"llmman-import-test-{uuid.uuid4().hex}"
    yield Store(root / "store")
    shutil.rmtree(root, ignore_errors=True)


def test_hard_link_not_a_copy_and_reimport_changes_nothing(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "models" / "Tiny-Q4_0.gguf")
    store = Store(tmp_path / "store")
    (first,) = import_all(store, discover(tmp_path / "models"))
    assert (first.state, first.how, first.name) == ("imported", "hard link", "localhost/Tiny:Q4_0")
    model = store.get(parse_reference(first.name))
    blob = store.files(model).model
    assert os.path.samefile(blob, src) and src.stat().st_nlink == 2
    index = store.layout.index_path
    before = (index.read_bytes(), index.stat().st_mtime_ns, store.blob_path(model.digest).stat().st_mtime_ns)
    (again,) = import_all(store, discover(tmp_path / "models"))
    assert again.state == "unchanged"
    # not even linked again to be hashed (a link would change the inode's ctime, and the next load would
    # hash the file once more): the digest of a file the store already links is known
    assert store.layout.is_verified(model.layers[0]["digest"])
    after = (index.read_bytes(), index.stat().st_mtime_ns, store.blob_path(model.digest).stat().st_mtime_ns)
    assert after == before
    assert store.remove(parse_reference(first.name))  # rm removes the store's link only
    assert src.is_file() and src.stat().st_nlink == 1


def test_a_name_in_use_is_left_alone_and_name_needs_one_model(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "models" / "Tiny-Q4_0.gguf")
    other = write_gguf(tmp_path / "other.gguf", name="Other")
    store = Store(tmp_path / "store")
    built = store.build(parse_reference("localhost/Tiny:Q4_0"), other)
    (outcome,) = import_all(store, discover(src))
    assert outcome.state == "skipped" and "--name" in outcome.detail
    assert store.get(parse_reference("localhost/Tiny:Q4_0")).digest == built.digest
    (renamed,) = import_all(store, discover(src), name="tiny-imported")
    assert renamed.state == "imported" and renamed.name == "docker.io/ai/tiny-imported:latest"
    write_gguf(tmp_path / "models" / "Second-Q8_0.gguf")
    with pytest.raises(BadRequest, match="--name names one model"):
        import_all(store, discover(tmp_path / "models"), name="x")


def test_hard_linked_source_changed_is_a_clear_error(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "models" / "Tiny-Q4_0.gguf")
    store = Store(tmp_path / "store")
    (outcome,) = import_all(store, discover(src))
    model = store.get(parse_reference(outcome.name))
    store.files(model)
    _flip_last_byte(src)  # the user's file changes in place: the shared inode changes with it
    with pytest.raises(StoreError) as caught:
        store.files(model)
    assert caught.value.code == "import_changed" and caught.value.status == 503
    assert str(src) in caught.value.message and "has changed" in caught.value.message
    assert src.is_file()  # the user's file is never removed, only the store's link


def test_reference_on_another_file_system(tmp_path: Path, other_fs_store: Store) -> None:
    store = other_fs_store
    src = write_gguf(tmp_path / "models" / "Tiny-Q4_0.gguf")
    (outcome,) = import_all(store, discover(src))
    assert (outcome.state, outcome.how) == ("imported", "reference")
    model = store.get(parse_reference(outcome.name))
    blob = store.blob_path(model.layers[0]["digest"])
    assert blob.is_symlink() and os.readlink(blob) == str(src.resolve())
    assert os.path.samefile(store.files(model).model, src)
    (again,) = import_all(store, discover(src))
    assert (again.state, again.how) == ("unchanged", "reference")
    _flip_last_byte(src)
    with pytest.raises(StoreError) as caught:
        store.files(model)
    assert caught.value.code == "import_changed" and str(src) in caught.value.message
    assert src.is_file() and not blob.is_symlink()
    (back,) = import_all(store, discover(src))  # imported again: the changed file is a new blob
    assert back.state == "updated"
    model = store.get(parse_reference(back.name))
    src.unlink()
    with pytest.raises(StoreError) as caught:
        store.files(model)
    assert caught.value.code == "import_missing" and "is gone" in caught.value.message


def test_ollama_model_keeps_its_layers_and_is_hashed_at_first_load(tmp_path: Path) -> None:
    models = tmp_path / "ollama"
    manifest = ollama_store(models, write_gguf(tmp_path / "w.gguf"), system="Be brief.",
                            params={"temperature": 0.2, "stop": ["<|im_end|>"]})
    store = Store(tmp_path / "store")
    (outcome,) = import_all(store, discover(models))
    assert (outcome.state, outcome.name) == ("imported", "ollama.com/library/smollm2:135m")
    model = store.get(parse_reference(outcome.name))
    assert layer_role(model.layers[0]) == "model"
    extras = read_extras(store.layout, model)
    assert extras.system == "Be brief." and extras.parameters == {"temperature": 0.2, "stop": ["<|im_end|>"]}
    assert extras.license == ["Apache 2.0"]
    weights = model.layers[0]["digest"]
    assert not store.layout.is_verified(weights)  # the name's digest is trusted until the first load
    files = store.files(model)
    assert store.layout.is_verified(weights)
    assert os.path.samefile(files.model, models / "blobs" / f"sha256-{weights[7:]}")
    # Ollama pulls the tag again (new weights): the import follows it
    ollama_store(models, write_gguf(tmp_path / "w2.gguf", name="Newer"))
    (updated,) = import_all(store, discover(models))
    assert updated.state == "updated"
    assert store.get(parse_reference(outcome.name)).layers[0]["digest"] != weights
    assert manifest.is_file()


def test_ollama_blob_with_wrong_bytes_fails_its_first_load(tmp_path: Path) -> None:
    models = tmp_path / "ollama"
    ollama_store(models, write_gguf(tmp_path / "w.gguf"), copy=True)
    store = Store(tmp_path / "store")
    (outcome,) = import_all(store, discover(models))
    model = store.get(parse_reference(outcome.name))
    digest = model.layers[0]["digest"]
    _flip_last_byte(models / "blobs" / f"sha256-{digest[7:]}")
    with pytest.raises(StoreError) as caught:
        store.files(model)
    assert caught.value.code == "import_changed"
    assert str(models / "blobs" / f"sha256-{digest[7:]}") in caught.value.message  # the file, named
    assert (models / "blobs" / f"sha256-{digest[7:]}").is_file()


def test_a_newer_hf_revision_updates_the_import(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    hf_cache(hub, "org/Tiny-GGUF", {"Tiny-Q4_0.gguf": write_gguf(tmp_path / "a.gguf")}, revision="1" * 40)
    store = Store(tmp_path / "store")
    (first,) = import_all(store, discover(hub))
    assert (first.state, first.name, first.how) == ("imported", "hf.co/org/Tiny-GGUF:Q4_0", "hard link")
    newer = hf_cache(hub, "org/Tiny-GGUF", {"Tiny-Q4_0.gguf": write_gguf(tmp_path / "b.gguf", name="New")},
                     revision="2" * 40)
    (again,) = import_all(store, discover(hub))
    assert again.state == "updated"
    files = store.files(store.get(parse_reference(first.name)))
    assert os.path.samefile(files.model, newer / "Tiny-Q4_0.gguf")

