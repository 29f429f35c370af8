"""The OCI model store: build, list/find/get, files, tag, remove, gc, layout validity."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

import pytest
from ggufgen import write_gguf, write_mmproj, write_split

from llmman.errors import BadRequest, ModelNotFound, StoreError
from llmman.refs import parse_reference
from llmman.store import Store, StoredModel
from llmman.store import mediatypes as mt


def sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "src" / "tiny.gguf", size_label="135M")


def blob_names(store: Store) -> set[str]:
    return {p.name for p in store.layout.blobs.iterdir()} if store.layout.blobs.exists() else set()


def validate_layout(store: Store) -> None:
    """The checks an OCI image-layout reader makes (image-spec image-layout.md)."""
    assert json.loads((store.root / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((store.root / "index.json").read_text())
    assert index["schemaVersion"] == 2 and index["mediaType"] == mt.OCI_INDEX

    def check(desc: dict[str, object]) -> Path:
        path = store.root / "blobs" / "sha256" / str(desc["digest"]).split(":", 1)[1]
        assert path.is_file() and path.stat().st_size == desc["size"] and sha256(path) == desc["digest"]
        return path

    for entry in index["manifests"]:
        assert entry["annotations"][mt.REF_NAME]
        manifest = json.loads(check(entry).read_bytes())
        assert manifest["schemaVersion"] == 2 and manifest["mediaType"] == entry["mediaType"]
        check(manifest["config"])
        for layer in manifest["layers"]:
            check(layer)


def test_empty_store_reads_without_creating(store: Store) -> None:
    assert store.list() == []
    assert store.find(parse_reference("tiny")) is None
    with pytest.raises(ModelNotFound, match=r"model 'docker\.io/ai/tiny:latest' not found"):
        store.get(parse_reference("tiny"))
    assert not store.root.exists()


def test_build_single_file(store: Store, model_file: Path) -> None:
    ref = parse_reference("tiny:1b")
    model = store.build(ref, model_file, labels={"org.opencontainers.image.source": "test"})
    assert isinstance(model, StoredModel)
    assert model.reference == "docker.io/ai/tiny:1b"
    assert model.size == model_file.stat().st_size and len(model.short_id) == 12
    assert model.digest.startswith("sha256:") and model.digest.endswith(model.hex)
    assert store.list() == [model]
    assert store.get(parse_reference("TINY:1B")) == model  # case-insensitive
    assert store.find(parse_reference("docker.io/ai/tiny:1b")) == model
    assert store.find(parse_reference("tiny")) is None

    files = store.files(model)
    assert files.model == store.blob_path(sha256(model_file)) and files.shards == (files.model,)
    assert files.mmproj is None and files.model.read_bytes() == model_file.read_bytes()
    info = store.info(model)
    assert info.architecture == "llama" and info.parameter_size == "135M"
    assert "vision" not in info.capabilities
    validate_layout(store)

    manifest = model.manifest
    assert manifest["mediaType"] == mt.OCI_MANIFEST and manifest["artifactType"] == mt.MODEL_ARTIFACT
    assert manifest["annotations"] == {"org.opencontainers.image.source": "test"}
    assert manifest["config"]["mediaType"] == mt.MODEL_CONFIG
    config = json.loads(store.blob_path(manifest["config"]["digest"]).read_bytes())
    assert config["descriptor"]["name"] == "docker.io/ai/tiny:1b" and config["descriptor"]["createdAt"]
    assert config["config"] == {
        "format": "gguf", "architecture": "llama", "paramSize": "135M", "quantization": "Q4_1",
        "capabilities": {"inputTypes": ["text"], "outputTypes": ["text"]},
    }
    assert config["modelfs"] == {"type": "layers", "diffIds": [sha256(model_file)]}
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == mt.MODEL_WEIGHT_RAW
    assert layer["annotations"][mt.FILEPATH] == layer["annotations"][mt.TITLE] == "tiny.gguf"
    index = json.loads((store.root / "index.json").read_text())
    assert index["manifests"][0]["artifactType"] == mt.MODEL_ARTIFACT


def test_split_mmproj_and_docs(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "qwen"
    shards = write_split(folder, prefix="Qwen-Q4_K_M", count=3)
    write_mmproj(folder / "mmproj-F16.gguf")
    (folder / "LICENSE").write_text("Apache-2.0")
    (folder / "README.md").write_text("# readme")
    (folder / "notes.txt").write_text("ignored")
    model = store.build(parse_reference("hf.co/owner/Qwen-GGUF:Q4_K_M"), folder)
    roles = [(d["mediaType"], d["annotations"][mt.FILEPATH], d["annotations"].get(mt.ROLE))
             for d in model.manifest["layers"]]
    assert roles == [
        (mt.MODEL_WEIGHT_RAW, "Qwen-Q4_K_M-00001-of-00003.gguf", None),
        (mt.MODEL_WEIGHT_RAW, "Qwen-Q4_K_M-00002-of-00003.gguf", None),
        (mt.MODEL_WEIGHT_RAW, "Qwen-Q4_K_M-00003-of-00003.gguf", None),
        (mt.MODEL_WEIGHT_RAW, "mmproj-F16.gguf", "mmproj"),
        (mt.MODEL_DOC_RAW, "LICENSE", None),
        (mt.MODEL_DOC_RAW, "README.md", None),
    ]
    files = store.files(model)
    cache = store.cache_dir / model.hex
    assert files.model == cache / "Qwen-Q4_K_M-00001-of-00003.gguf"
    assert files.shards == tuple(cache / p.name for p in shards)
    for link, source in zip(files.shards, shards, strict=True):
        assert link.is_symlink() and Path(os.readlink(link)) == store.blob_path(sha256(source)).resolve()
    assert sorted(os.listdir(cache)) == sorted(p.name for p in shards)
    assert files.mmproj == store.blob_path(sha256(folder / "mmproj-F16.gguf"))
    assert store.files(model) == files  # idempotent
    info = store.info(model)
    assert "vision" in info.capabilities and info.parameter_count == 3 * (8 * 32 + 32)
    config = json.loads(store.blob_path(model.manifest["config"]["digest"]).read_bytes())
    assert config["config"]["capabilities"]["inputTypes"] == ["text", "image"]
    validate_layout(store)


def test_mmproj_detected_by_architecture(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    write_gguf(folder / "model.gguf")
    write_mmproj(folder / "vision-projector.gguf")
    model = store.build(parse_reference("vis"), folder)
    assert store.files(model).mmproj == store.blob_path(sha256(folder / "vision-projector.gguf"))


@pytest.mark.parametrize(
    "case", ["missing", "empty", "not-gguf", "gap", "two-models", "lone-shard", "only-mmproj", "junk-gguf"]
)
def test_build_rejects_bad_input(store: Store, tmp_path: Path, case: str) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    target = folder
    if case == "missing":
        target = tmp_path / "nope"
    elif case == "not-gguf":
        target = folder / "weights.bin"
        target.write_bytes(b"\0" * 100)
    elif case == "gap":
        write_split(folder, count=3)[1].unlink()
    elif case == "two-models":
        write_gguf(folder / "a.gguf")
        write_gguf(folder / "b.gguf")
    elif case == "lone-shard":
        target = write_split(folder, count=2)[0]
    elif case == "only-mmproj":
        write_mmproj(folder / "mmproj.gguf")
    elif case == "junk-gguf":
        (folder / "x.gguf").write_text("hello")
    with pytest.raises(BadRequest):
        store.build(parse_reference("bad"), target)
    assert store.list() == [] and not blob_names(store) - {"tmp"}


def test_rebuild_replaces_and_collects_old_blobs(store: Store, tmp_path: Path) -> None:
    first = write_gguf(tmp_path / "a" / "m.gguf", context_length=1024)
    second = write_gguf(tmp_path / "b" / "m.gguf", context_length=4096)
    store.build(parse_reference("other"), tmp_path / "b")
    old = store.build(parse_reference("m"), first)
    new = store.build(parse_reference("m"), second)
    assert [m.reference for m in store.list()] == ["docker.io/ai/other:latest", "docker.io/ai/m:latest"]
    assert new.digest != old.digest and store.info(new).context_length == 4096
    assert not store.blob_path(sha256(first)).exists() and not store.blob_path(old.digest).exists()
    validate_layout(store)


def test_tag_remove_gc(store: Store, model_file: Path) -> None:
    model = store.build(parse_reference("tiny"), model_file)
    tagged = store.tag(parse_reference("tiny"), parse_reference("example.com/ns/alias:v1"))
    assert tagged.digest == model.digest and tagged.reference == "example.com/ns/alias:v1"
    assert [m.reference for m in store.list()] == ["docker.io/ai/tiny:latest", "example.com/ns/alias:v1"]
    assert store.remove(parse_reference("tiny")) == []  # blobs still used by the alias
    assert store.files(tagged).model.exists()
    removed = store.remove(parse_reference("example.com/ns/alias:v1"))
    expected = {model.digest, model.manifest["config"]["digest"], sha256(model_file)}
    assert set(removed) == expected and blob_names(store) == set()
    assert json.loads((store.root / "index.json").read_text())["manifests"] == []
    with pytest.raises(ModelNotFound):
        store.remove(parse_reference("tiny"))
    with pytest.raises(ModelNotFound):
        store.tag(parse_reference("tiny"), parse_reference("x"))


def test_gc_removes_orphans_stale_temps_and_cache(store: Store, tmp_path: Path, model_file: Path) -> None:
    keep = store.build(parse_reference("keep"), model_file)
    split = store.build(parse_reference("split"), write_split(tmp_path / "s", count=2)[0].parent)
    cache = store.files(split).model.parent
    orphan = store.layout.blobs / ("ab" * 32)
    orphan.write_bytes(b"orphan")
    stale, live = store.layout.blobs / "dead.tmp", store.layout.blobs / "live.tmp"
    stale.write_bytes(b"x")
    live.write_bytes(b"y")
    os.utime(stale, (1, 1))
    os.utime(live, (1, 1))
    with open(live, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        store.remove(parse_reference("split"))
        assert f"sha256:{'ab' * 32}" not in {m.digest for m in store.list()}
        assert not orphan.exists() and not stale.exists() and live.exists() and not cache.exists()
    assert store.files(keep).model.exists()
    validate_layout(store)


def test_write_blob_verifies_and_leaves_nothing_on_mismatch(store: Store) -> None:
    data = b"hello world" * 1000
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with pytest.raises(StoreError, match="digest mismatch"):
        store.write_blob([data], "sha256:" + "0" * 64, len(data))
    with pytest.raises(StoreError, match="size"):
        store.write_blob([data[:10], data[10:]], digest, len(data) - 1)
    assert blob_names(store) == set()
    assert not store.has_blob(digest)
    assert store.write_blob(iter([data[:7], data[7:]]), digest, len(data)) == digest
    inode = store.blob_path(digest).stat().st_ino
    with open(store.blob_path(digest), "rb") as f:
        assert store.write_blob(f) == digest
    assert store.blob_path(digest).stat().st_ino == inode and store.has_blob(digest, len(data))
    assert not store.has_blob(digest, 1)
    with pytest.raises(StoreError):
        store.blob_path("md5:abc")


def test_put_manifest_requires_its_blobs(store: Store, model_file: Path) -> None:
    store.build(parse_reference("tiny"), model_file)
    before = (store.root / "index.json").read_bytes()
    manifest = {"schemaVersion": 2, "mediaType": mt.OCI_MANIFEST,
                "config": {"mediaType": mt.MODEL_CONFIG, "digest": "sha256:" + "1" * 64, "size": 2},
                "layers": []}
    with pytest.raises(StoreError, match="missing blob"):
        store.put_manifest(parse_reference("x"), json.dumps(manifest).encode(), mt.OCI_MANIFEST)
    assert (store.root / "index.json").read_bytes() == before


def test_failure_mid_write_leaves_index_and_blobs_unchanged(
    store: Store, tmp_path: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.build(parse_reference("tiny"), model_file)
    index_before, blobs_before = (store.root / "index.json").read_bytes(), blob_names(store)
    real_replace = os.replace

    def failing_replace(src: str | Path, dst: str | Path) -> None:
        if "blobs" in str(dst):
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr("llmman.store.layout.os.replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        store.build(parse_reference("new"), write_gguf(tmp_path / "n.gguf", context_length=77))
    assert (store.root / "index.json").read_bytes() == index_before
    assert blob_names(store) == blobs_before

    def failing_index(src: str | Path, dst: str | Path) -> None:
        if str(dst).endswith("index.json"):
            raise OSError("rename failed")
        real_replace(src, dst)

    monkeypatch.setattr("llmman.store.layout.os.replace", failing_index)
    with pytest.raises(OSError, match="rename failed"):
        store.build(parse_reference("new"), tmp_path / "n.gguf")
    monkeypatch.undo()
    assert (store.root / "index.json").read_bytes() == index_before
    assert blob_names(store) == blobs_before and not list(store.root.glob("*.tmp"))
    assert [m.reference for m in store.list()] == ["docker.io/ai/tiny:latest"]


def test_docker_artifact_layers(store: Store, tmp_path: Path) -> None:
    """Docker Model Runner manifests (application/vnd.docker.ai.*) as a pull would store them."""
    shards = write_split(tmp_path / "d", count=2)
    proj = write_mmproj(tmp_path / "p.gguf")
    layers = []
    for path, media in [(shards[0], mt.DOCKER_AI_GGUF), (shards[1], mt.DOCKER_AI_GGUF),
                        (proj, mt.DOCKER_AI_MMPROJ)]:
        with open(path, "rb") as f:
            digest = store.write_blob(f, sha256(path), path.stat().st_size)
        layers.append({"mediaType": media, "digest": digest, "size": path.stat().st_size})
    config = b'{"config":{"format":"gguf"}}'
    cdigest = store.write_blob([config])
    manifest = {"schemaVersion": 2, "mediaType": mt.OCI_MANIFEST,
                "config": {"mediaType": mt.DOCKER_AI_CONFIG, "digest": cdigest, "size": len(config)},
                "layers": layers}
    body = json.dumps(manifest).encode()
    ref = parse_reference("ai/gemma3:4b".removeprefix("ai/"))
    model = store.put_manifest(ref, body, mt.OCI_MANIFEST)
    files = store.files(model)
    assert [p.name for p in files.shards] == ["model-00001-of-00002.gguf", "model-00002-of-00002.gguf"]
    assert files.mmproj == store.blob_path(sha256(proj))
    assert "vision" in store.info(model).capabilities
    pinned = parse_reference(f"gemma3@{model.digest}")
    assert store.find(pinned) == model
    assert store.find(parse_reference(f"other@{model.digest}")) is None
    validate_layout(store)


def test_unreferenced_new_blobs_are_pinned_until_put(store: Store) -> None:
    """A pull writes layers before its manifest: gc must not take them meanwhile, in this process (the
    pin) nor in another one (the shared writers lock)."""
    data = b"layer bytes"
    digest = store.write_blob([data])
    assert store.gc() == [] and store.has_blob(digest)
    other = Store(store.root)  # its own lock file descriptors: stands for another process
    assert other.gc() == [] and store.has_blob(digest)
    # Once the writer lets go of its pins, the orphan is collected from anywhere.
    store.layout.unpin([digest])
    assert other.gc() == [digest] and not store.has_blob(digest)
    digest = store.write_blob([data])
    config = store.write_blob([b"{}"])
    manifest = {"schemaVersion": 2, "mediaType": mt.OCI_MANIFEST,
                "config": {"mediaType": mt.MODEL_CONFIG, "digest": config, "size": 2},
                "layers": [{"mediaType": mt.MODEL_WEIGHT_RAW, "digest": digest, "size": len(data)}]}
    model = store.put_manifest(parse_reference("pulled"), json.dumps(manifest).encode(), mt.OCI_MANIFEST)
    assert model.size == len(data)
    assert Store(store.root).gc() == [] and store.has_blob(digest)
    assert set(store.remove(parse_reference("pulled"))) == {digest, config, model.digest}
