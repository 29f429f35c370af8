"""Fault: a blob of the store is corrupted on disk (issue 13, item 5), at the store level.

One flipped byte in a GGUF blob: a load (``Store.files``) must notice it and remove the blob instead of
handing llama-server wrong weights; a build that finds the blob present must not trust it; ``llmman
verify`` (``--store``, no daemon) must report it and exit 1. An unchanged blob is trusted on its
recorded stat, so a load does not hash it again. Before the fix none of this was checked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from llmman.cli.main import main
from llmman.errors import StoreError
from llmman.refs import parse_reference
from llmman.store import Store, StoredModel
from llmman.store import layout as layout_module
from tests.unit.ggufgen import write_gguf

REF = parse_reference("corrupt/me:1")


def flip_byte(path: Path, offset: int = 1000) -> None:
    """Flip one bit in place, as a bad disk or a stray write would."""
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def gguf_blob(store: Store, model: StoredModel) -> Path:
    return store.files(model, verify=False).model


@pytest.fixture
def built(tmp_path: Path) -> tuple[Store, StoredModel, Path]:
    source = write_gguf(tmp_path / "src" / "tiny.gguf", size_label="135M")
    store = Store(tmp_path / "store")
    model = store.build(REF, source)
    return store, model, source


def test_a_load_refuses_a_flipped_byte_and_removes_the_blob(built: tuple[Store, StoredModel, Path]) -> None:
    store, model, _ = built
    blob = gguf_blob(store, model)
    store.files(model)  # fine as written
    flip_byte(blob)
    with pytest.raises(StoreError, match="corrupt") as err:
        store.files(model)
    assert err.value.status == 503
    assert not blob.exists()
    assert not store.layout.is_verified(f"sha256:{blob.name}")


def test_an_unchanged_blob_is_trusted_on_its_stat(built: tuple[Store, StoredModel, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store, model, _ = built
    digest = f"sha256:{gguf_blob(store, model).name}"
    assert store.layout.is_verified(digest)  # recorded when the build wrote it
    record = json.loads((store.root / "verified" / digest.split(":")[1]).read_text())
    assert {"size", "mtime_ns", "ctime_ns", "ino", "dev"} <= set(record)
    hashed: list[int] = []
    real = layout_module.hashlib.sha256

    def spy(*args: object) -> object:
        hashed.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(layout_module.hashlib, "sha256", spy)
    for _ in range(3):
        store.files(model)
    assert hashed == []  # three loads, no full hash
    os.utime(gguf_blob(store, model))  # touched: its stat changed, so the next load hashes it once
    store.files(model)
    store.files(model)
    assert len(hashed) == 1


def test_a_build_does_not_trust_a_corrupt_blob_it_finds(built: tuple[Store, StoredModel, Path]) -> None:
    store, model, source = built
    blob = gguf_blob(store, model)
    flip_byte(blob)
    again = store.build(parse_reference("corrupt/again:1"), source)
    assert blob.read_bytes() == source.read_bytes()  # the bad copy was replaced by the good bytes
    store.files(again)


def test_verify_reports_the_corrupt_blob_and_exits_1(built: tuple[Store, StoredModel, Path],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    store, model, _ = built
    assert main(["verify", "--store", str(store.root)]) == 0
    assert "all good" in capsys.readouterr().out
    blob = gguf_blob(store, model)
    flip_byte(blob)
    assert main(["verify", "--store", str(store.root), str(REF)]) == 1
    out = capsys.readouterr().out
    assert f"corrupt (removed)  sha256:{blob.name[:12]}" in out and str(REF) in out
    assert "1 bad" in out
    assert main(["verify", "--store", str(store.root)]) == 1  # still missing until repaired
    assert "missing" in capsys.readouterr().out
    assert main(["verify", "--store", str(store.root), "not/there:1"]) == 1
    assert "not found" in capsys.readouterr().err
