"""The store's listing kept in memory (llmman.store.listing): reused while the store is unchanged, read
again when this process or another one changed it, never trusted on stamps too young to prove anything.

"Another process" is a real ``llmman tag``/``rm``/``build`` subprocess on the same store, or a second
:class:`Store` object (its own index and write counter: only the files tell one from the other, as
between processes). A listing made with a clock some seconds ahead sees every stamp as old: that is a
store written a while ago, the case where the kept listing is trusted without reading anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ggufgen import write_gguf

from llmman.gguf import GGUFInfo
from llmman.refs import parse_reference
from llmman.store import Store, StoredModel
from llmman.store.listing import RACY_S, StoreIndex

REPO = Path(__file__).resolve().parents[2]


def ahead() -> float:
    """A clock far enough ahead that every file time looks older than RACY_S."""
    return time.time() + 10 * RACY_S


def kept_store(root: Path) -> Store:
    """A Store whose listing trusts stamps at once (see :func:`ahead`)."""
    store = Store(root)
    store.index = StoreIndex(store.layout, store.info, clock=ahead)
    return store


@pytest.fixture
def root(tmp_path: Path) -> Path:
    writer = Store(tmp_path / "store")
    for i, name in enumerate(("alpha:1", "beta:2", "example.com/ns/gamma:3")):
        writer.build(parse_reference(name), write_gguf(tmp_path / "src" / f"m{i}.gguf", name=f"model {i}"))
    return tmp_path / "store"


def cli(root: Path, *args: str) -> None:
    """Run the real ``llmman`` command on ``root`` directly (``--store``), in its own process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_"))}
    env["LLMMAN_HOST"] = "127.0.0.1:9"  # no daemon answers there: the store is used directly
    done = subprocess.run([sys.executable, "-m", "llmman", "--store", str(root), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def names(store: Store) -> list[str]:
    return [m.reference for m in store.list()]


def test_an_unchanged_store_is_listed_without_reading_it(root: Path) -> None:
    store = kept_store(root)
    first = store.listing(details=True)
    assert [m.reference for m in first.models] == [
        "docker.io/ai/alpha:1", "docker.io/ai/beta:2", "example.com/ns/gamma:3"]
    assert store.listing_if_current(details=True) is first
    assert store.listing(details=True) is first and store.list() == list(first.models)
    assert store.index.refreshes == 1


def test_stamps_younger_than_the_clock_tick_are_not_trusted(root: Path) -> None:
    """A clock that reads the index's own ctime: the listing was read in the same tick as the last write,
    so a write in that tick could leave every stamp equal. It is read again at each use."""
    store = Store(root)
    store.index = StoreIndex(store.layout, store.info, clock=lambda: os.stat(root / "index.json").st_ctime)
    store.list()
    assert store.listing_if_current() is None
    store.list()
    assert store.index.refreshes == 2


def test_a_tag_and_an_rm_by_another_process_show_at_the_next_listing(root: Path) -> None:
    store = kept_store(root)
    assert "docker.io/ai/delta:4" not in names(store)
    cli(root, "tag", "alpha:1", "delta:4")
    assert store.listing_if_current() is None
    assert names(store) == ["docker.io/ai/alpha:1", "docker.io/ai/beta:2", "example.com/ns/gamma:3",
                            "docker.io/ai/delta:4"]
    found = store.find(parse_reference("DELTA:4"))
    assert found is not None and found.digest == store.find(parse_reference("alpha:1")).digest  # type: ignore[union-attr]
    cli(root, "rm", "beta:2")
    assert names(store) == ["docker.io/ai/alpha:1", "example.com/ns/gamma:3", "docker.io/ai/delta:4"]
    assert store.find(parse_reference("beta:2")) is None
    assert store.index.refreshes == 3


def test_a_build_by_another_process_shows_with_its_details(root: Path, tmp_path: Path) -> None:
    store = kept_store(root)
    store.listing(details=True)
    source = write_gguf(tmp_path / "src" / "new.gguf", arch="qwen2", name="fresh", context_length=4096)
    cli(root, "build", "-t", "fresh:5", str(source))
    listing = store.listing(details=True)
    model = listing.find(parse_reference("fresh:5"))
    assert model is not None
    info = listing.info(model.digest)
    assert info is not None and info.architecture == "qwen2" and info.context_length == 4096


def test_another_store_object_writing_is_seen_like_another_process(root: Path, tmp_path: Path) -> None:
    """Re-putting the same manifest changes only its modified_at (the index bytes stay the same)."""
    store, other = kept_store(root), Store(root)
    store.list()
    before = store.find(parse_reference("alpha:1"))
    assert before is not None and store.listing_if_current() is not None
    os.utime(other.layout.blob_path(before.digest), ns=(10**18, 10**18))  # made long ago
    other.put_manifest(parse_reference("alpha:1"), other.layout.read_blob(before.digest), before.manifest[
        "mediaType"])
    after = store.find(parse_reference("alpha:1"))
    assert after is not None and after.digest == before.digest and after.modified_at > before.modified_at
    other.remove(parse_reference("example.com/ns/gamma:3"))
    assert names(store) == ["docker.io/ai/alpha:1", "docker.io/ai/beta:2"]


def test_a_manifest_removed_behind_the_index_leaves_the_listing(root: Path) -> None:
    """``llmman verify`` (here a second Store's check) removes a corrupt manifest without touching the
    index: the blobs folder changed, so the listing is read again and skips the unreadable entry."""
    store, other = kept_store(root), Store(root)
    beta = store.find(parse_reference("beta:2"))
    assert beta is not None and len(store.list()) == 3
    path = other.layout.blob_path(beta.digest)
    path.write_bytes(b"{}")  # rewritten in place: the folder does not change
    assert [c.state for c in other.check([parse_reference("beta:2")])] == ["corrupt"]
    assert names(store) == ["docker.io/ai/alpha:1", "example.com/ns/gamma:3"]


def test_find_from_the_kept_listing_matches_the_index_rule(root: Path) -> None:
    store, direct = kept_store(root), Store(root)
    store.list()
    alpha = direct.find(parse_reference("alpha:1"))
    assert alpha is not None
    cli(root, "tag", "alpha:1", "example.com/ns/alpha:1")
    store.list()
    assert store.listing_if_current() is not None
    for name in ("alpha:1", "ALPHA:1", "docker.io/ai/alpha:1", "alpha", f"alpha@{alpha.digest}",
                 f"example.com/ns/alpha@{alpha.digest}", f"beta@{alpha.digest}", "example.com/ns/gamma:3",
                 "nothing:1"):
        ref = parse_reference(name)
        assert store.find(ref) == direct.find(ref), name


def test_details_are_read_once_per_manifest_and_again_when_a_file_returns(root: Path) -> None:
    reads: list[str] = []
    store = Store(root)

    def counted(model: StoredModel) -> GGUFInfo:
        reads.append(model.reference)
        return store.info(model)

    store.index = StoreIndex(store.layout, counted, clock=ahead)
    listing = store.listing(details=True)
    assert sorted(reads) == ["docker.io/ai/alpha:1", "docker.io/ai/beta:2", "example.com/ns/gamma:3"]
    gamma = listing.find(parse_reference("example.com/ns/gamma:3"))
    assert gamma is not None and listing.info(gamma.digest) is not None
    cli(root, "tag", "alpha:1", "delta:4")  # the index changed, no GGUF did
    assert store.listing(details=True) is not listing and len(reads) == 3
    layer = store.layout.blob_path(gamma.layers[0]["digest"])
    moved = layer.with_name("away")
    layer.rename(moved)  # a missing weight: the model still lists, without details
    listing = store.listing(details=True)
    assert listing.find(parse_reference("example.com/ns/gamma:3")) is not None
    assert listing.info(gamma.digest) is None
    moved.rename(layer)
    listing = store.listing(details=True)
    assert listing.info(gamma.digest) is not None and reads.count("example.com/ns/gamma:3") == 3


def test_an_unreadable_index_entry_is_skipped_and_an_empty_store_lists_nothing(tmp_path: Path) -> None:
    store = kept_store(tmp_path / "none")
    assert store.list() == [] and store.listing_if_current() is not None
    assert not (tmp_path / "none").exists()
    root = tmp_path / "s"
    Store(root).build(parse_reference("one:1"), write_gguf(tmp_path / "one.gguf"))
    index = json.loads((root / "index.json").read_text())
    index["manifests"].append({"digest": "sha256:" + "ab" * 32, "annotations": {
        "org.opencontainers.image.ref.name": "docker.io/ai/ghost:1"}})
    (root / "index.json").write_text(json.dumps(index))
    assert names(kept_store(root)) == ["docker.io/ai/one:1"]


def test_a_lookup_reads_the_listing_once_the_store_is_old_enough(root: Path) -> None:
    """Each request looks its model up (Store.find): from the kept listing, read by the first lookup once
    the stamps can be trusted; within RACY_S of a write, from index.json directly (not a full listing)."""
    store = kept_store(root)
    assert store.find(parse_reference("beta:2")) is not None
    assert store.index.refreshes == 1 and store.listing_if_current() is not None
    cli(root, "tag", "beta:2", "epsilon:5")
    assert store.find(parse_reference("epsilon:5")) is not None and store.index.refreshes == 2
    young = Store(root)
    young.index = StoreIndex(young.layout, young.info, clock=lambda: os.stat(root / "index.json").st_ctime)
    assert young.find(parse_reference("epsilon:5")) is not None
    assert young.find(parse_reference("beta:2")) is not None and young.index.refreshes == 0
