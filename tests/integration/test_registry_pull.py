"""Pull and push against a REAL registry (Debian's docker-registry), at the store level.

Docker model artifacts and ModelPack artifacts go up with ``push`` and come back with the puller into a
fresh store: same manifest digests. Also: resume from a partial, a corrupted blob fails verification and
leaves the index unchanged, two concurrent pulls download each blob once, basic auth over TLS with a
test CA, wrong credentials.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmman.errors import LlmmanError, StoreError
from llmman.refs import parse_reference
from llmman.registry import download, splice
from llmman.registry.client import RegistryAuthError, RegistryNotFound, RegistryOptions
from llmman.registry.credentials import Credential, CredentialStore
from llmman.registry.puller import Puller
from llmman.registry.push import push
from llmman.store import Store
from llmman.store import mediatypes as mt
from tests.integration.registry import (
    PASSWORD,
    USER,
    Registry,
    available,
    docker_artifact,
    start_registry,
)

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not available(), reason="docker-registry missing")]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


@pytest.fixture(autouse=True)
def _insecure(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMMAN_INSECURE_REGISTRIES", registry.host)


@pytest.fixture(scope="module")
def pushed(registry: Registry, tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> dict[str, str]:
    """SmolLM2 pushed as ModelPack (``ai/smollm2:135m``) and as a Docker artifact (``ai/smollm2:docker``)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("LLMMAN_INSECURE_REGISTRIES", registry.host)
    store = Store(tmp_path_factory.mktemp("src") / "store")
    pack = parse_reference(f"{registry.host}/ai/smollm2:135m")
    dock = parse_reference(f"{registry.host}/ai/smollm2:docker")
    digests = {"pack": store.build(pack, model_file).digest,
               "docker": docker_artifact(store, dock, model_file)}
    for ref in (pack, dock):
        lines: list[dict[str, Any]] = []
        assert push(store, ref, None, lines.append) == digests["pack" if ref is pack else "docker"]
        assert lines[0] == {"status": "retrieving manifest"} and lines[-1] == {"status": "success"}
    mp.undo()
    return digests


def test_pull_back_both_artifact_kinds(tmp_path: Path, registry: Registry, pushed: dict[str, str]) -> None:
    store = Store(tmp_path / "store")
    puller = Puller(store)
    for tag, kind in (("135m", "pack"), ("docker", "docker")):
        lines: list[dict[str, Any]] = []
        model = puller.pull(parse_reference(f"{registry.host}/ai/smollm2:{tag}"), lines.append)
        assert model.digest == pushed[kind]
        assert store.files(model).model.stat().st_size > 90_000_000
        statuses = [line["status"] for line in lines]
        assert statuses[0] == "pulling manifest"
        assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
        layer = [line for line in lines if line.get("total", 0) > 1_000_000]
        assert layer and all(line["digest"].startswith("sha256:") for line in layer)
        assert layer[-1]["completed"] == layer[-1]["total"]
    assert not list((store.root / "partial").glob("*.partial"))


def test_missing_repository_is_not_found(tmp_path: Path, registry: Registry) -> None:
    store = Store(tmp_path / "store")
    with pytest.raises(RegistryNotFound):
        Puller(store).pull(parse_reference(f"{registry.host}/ai/nothing:here"))
    assert store.list() == []


@pytest.mark.parametrize("path", ["splice", "buffered"])
def test_resume_from_partial(tmp_path: Path, registry: Registry, pushed: dict[str, str],
                             model_file: Path, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    used: list[bool] = []
    real = splice.usable

    def spy(*args: Any) -> bool:
        used.append(path == "splice" and real(*args))
        return used[-1]

    monkeypatch.setattr(splice, "usable", spy)
    store = Store(tmp_path / "store")
    digest = "sha256:" + hashlib.sha256(model_file.read_bytes()).hexdigest()
    half = model_file.stat().st_size // 2
    partial = store.root / "partial" / f"{digest.split(':')[1]}.partial"
    partial.parent.mkdir(parents=True)
    with model_file.open("rb") as f:
        partial.write_bytes(f.read(half))
    lines: list[dict[str, Any]] = []
    model = Puller(store).pull(parse_reference(f"{registry.host}/ai/smollm2:135m"), lines.append)
    assert model.digest == pushed["pack"]
    first = next(line for line in lines if line.get("digest") == digest)
    assert first["completed"] == half  # resumed where the earlier pull stopped
    assert not partial.exists()
    assert used and all(used) == (path == "splice")  # plain HTTP takes the splice path unless barred


def test_corrupt_blob_fails_and_leaves_index(tmp_path: Path, registry: Registry, pushed: dict[str, str],
                                             model_file: Path) -> None:
    # A separate repository whose layer we corrupt inside the registry's storage (same size).
    src = Store(tmp_path / "src")
    ref = parse_reference(f"{registry.host}/ai/corrupt:1")
    data = b"GGUF" + bytes(range(256)) * 64
    small = tmp_path / "tiny.gguf"
    small.write_bytes(data)
    with small.open("rb") as f:
        layer = src.write_blob(f)
    manifest = {"schemaVersion": 2, "mediaType": mt.OCI_MANIFEST,
                "config": {"mediaType": mt.DOCKER_AI_CONFIG, "digest": src.write_blob([b"{}"]), "size": 2},
                "layers": [{"mediaType": mt.DOCKER_AI_GGUF, "digest": layer, "size": len(data)}]}
    src.put_manifest(ref, json.dumps(manifest).encode(), mt.OCI_MANIFEST)
    push(src, ref, None, lambda _: None)
    hexd = layer.split(":")[1]
    stored = registry.root / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"
    stored.write_bytes(b"XXXX" + data[4:])
    store = Store(tmp_path / "store")
    store.build(parse_reference("keep:me"), model_file)
    before = store.layout.index_path.read_bytes()
    with pytest.raises(StoreError, match="failed verification"):
        Puller(store).pull(ref)
    assert store.layout.index_path.read_bytes() == before
    assert not store.layout.blob_path(layer).exists()
    assert not list((store.root / "partial").glob("*.partial"))


def test_concurrent_pulls_download_once(tmp_path: Path, registry: Registry, pushed: dict[str, str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(tmp_path / "store")
    calls: list[str] = []
    real = download.Downloader._download

    def counting(self: download.Downloader, client: Any, repo: str, digest: str, *rest: Any) -> None:
        calls.append(digest)
        real(self, client, repo, digest, *rest)

    monkeypatch.setattr(download.Downloader, "_download", counting)
    # Two pullers = two independent pulls (as two processes would be): the flock makes it single-flight.
    refs = [f"{registry.host}/ai/smollm2:135m", f"{registry.host}/ai/smollm2:docker"]
    results: list[Any] = []
    start = threading.Barrier(2)

    def run(name: str) -> None:
        start.wait()
        results.append(Puller(store).pull(parse_reference(name)))

    threads = [threading.Thread(target=run, args=(r,)) for r in refs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2
    # Both models share the GGUF layer: it was downloaded once.
    assert len(calls) == len(set(calls))
    assert {m.digest for m in results} == {pushed["pack"], pushed["docker"]}


def test_push_to_a_second_repository_mounts_the_blobs(tmp_path: Path, registry: Registry,
                                                       model_file: Path) -> None:
    store = Store(tmp_path / "store")
    first = parse_reference(f"{registry.host}/ai/mount-a:1")
    second = parse_reference(f"{registry.host}/ai/mount-b:1")
    digest = store.build(first, model_file).digest
    push(store, first, None, lambda _: None)
    assert registry.requests("PUT", "/v2/ai/mount-a/blobs/uploads/")  # the first push uploaded
    store.tag(first, second)
    assert push(store, second, None, lambda _: None) == digest
    mounts = registry.requests("POST", "/v2/ai/mount-b/blobs/uploads/?mount=")
    assert mounts and all("from=ai%2Fmount-a" in line and '" 201 ' in line for line in mounts)
    assert not registry.requests("PUT", "/v2/ai/mount-b/blobs/uploads/")  # no blob bytes sent again
    assert Puller(Store(tmp_path / "back")).pull(second).digest == digest
    # A stored name whose repository the registry lacks: the refused mount's upload session is used.
    never, third = (parse_reference(f"{registry.host}/ai/{r}:1") for r in ("mount-never", "mount-c"))
    store.tag(first, never)
    store.remove(first)
    store.remove(second)
    store.tag(never, third)
    assert push(store, third, None, lambda _: None) == digest
    refused = registry.requests("POST", "/v2/ai/mount-c/blobs/uploads/?mount=")
    assert refused and all("from=ai%2Fmount-never" in line and '" 202 ' in line for line in refused)
    assert len(registry.requests("POST", "/v2/ai/mount-c/blobs/uploads/")) == len(refused)  # no extra POST
    assert len(registry.requests("PUT", "/v2/ai/mount-c/blobs/uploads/")) == len(refused)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("secure"), secure=True)
    yield reg
    reg.stop()


def test_tls_and_basic_auth(tmp_path: Path, secure: Registry, model_file: Path) -> None:
    assert secure.ca is not None
    trusted = RegistryOptions(ca_file=str(secure.ca))  # tls.ca_file, as the daemon and the CLI pass it
    creds = CredentialStore(tmp_path / "auth.json", docker_config=tmp_path / "docker.json")
    creds.save(secure.host, Credential(USER, PASSWORD))
    src = Store(tmp_path / "src")
    ref = parse_reference(f"{secure.host}/ai/smollm2:tls")
    digest = src.build(ref, model_file).digest
    push(src, ref, creds, lambda _: None, options=trusted)
    assert Puller(Store(tmp_path / "dst"), creds, options=trusted).pull(ref).digest == digest

    bad = CredentialStore(tmp_path / "bad.json", docker_config=tmp_path / "docker.json")
    bad.save(secure.host, Credential(USER, "wrong"))
    with pytest.raises(RegistryAuthError, match="401"):
        Puller(Store(tmp_path / "dst2"), bad, options=trusted).pull(ref)
    with pytest.raises(RegistryAuthError, match="authentication required"):
        Puller(Store(tmp_path / "dst3"), None, options=trusted).pull(ref)


def test_tls_without_the_ca_fails_clearly(tmp_path: Path, secure: Registry) -> None:
    ref = parse_reference(f"{secure.host}/ai/smollm2:tls")
    with pytest.raises(LlmmanError, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
        Puller(Store(tmp_path / "s")).pull(ref)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_loopback_plain_http_registry_needs_no_insecure(tmp_path: Path, registry: Registry, host: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """As Docker: a loopback registry is tried over HTTPS, then plain HTTP (no ``--insecure``)."""
    from tests.unit.ggufgen import write_gguf

    monkeypatch.delenv("LLMMAN_INSECURE_REGISTRIES", raising=False)
    ref = parse_reference(f"{host}:{registry.host.rsplit(':', 1)[1]}/ai/loopback:{host.replace('.', '-')}")
    src = Store(tmp_path / "src")
    digest = src.build(ref, write_gguf(tmp_path / "m.gguf")).digest
    assert push(src, ref, None, lambda _: None) == digest
    assert Puller(Store(tmp_path / "dst")).pull(ref).digest == digest
