"""Fault: a stored blob is corrupted on disk, seen through pulls, ``/v2``, loads and ``llmman verify``
(issue 13, item 5), against a real registry (Debian's ``docker-registry``) and a real daemon.

Before the fix: a later pull said "verifying sha256 digest … success" and kept the bad blob, ``/v2``
served it under its old digest to peers, and the model loaded with wrong weights. Now a pull re-verifies
a present blob it has no current verification record for and fetches it again, ``/v2`` answers 404
``BLOB_UNKNOWN`` for it, a load fails with a 503 naming the corrupt blob, and ``llmman verify --repair``
(through the daemon) fetches it back from the registry.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmman.cli.main import main
from llmman.refs import parse_reference
from llmman.registry.client import RegistryOptions
from llmman.registry.puller import Puller
from llmman.registry.push import push
from llmman.store import Store
from llmman.store import mediatypes as mt
from tests.faults.test_store_corrupt_blob import flip_byte
from tests.integration.conftest import _llama_server, _model_file
from tests.integration.daemons import start_daemon
from tests.integration.registry import Registry, available, start_registry

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not available(), reason="docker-registry missing")]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def smollm() -> Path:
    """The real SmolLM2 GGUF (``LLMMAN_TEST_MODEL``), as ``tests/integration``'s ``model_file`` finds it."""
    path = _model_file()
    if path is None or _llama_server() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have the real model and llama-server: run scripts/setup.sh --model")
        pytest.skip("real model or llama-server missing: run scripts/setup.sh --model")
    return path


def _options(registry: Registry) -> RegistryOptions:
    return RegistryOptions(insecure_registries=(registry.host,))


def _push_layer(registry: Registry, store: Store, name: str, data: bytes) -> str:
    """Push a one-layer Docker model artifact ``name`` whose layer is ``data``; returns the layer digest."""
    ref = parse_reference(f"{registry.host}/{name}")
    layer = store.write_blob([data])
    config = store.write_blob([b"{}"])
    manifest = {"schemaVersion": 2, "mediaType": mt.OCI_MANIFEST,
                "config": {"mediaType": mt.DOCKER_AI_CONFIG, "digest": config, "size": 2},
                "layers": [{"mediaType": mt.DOCKER_AI_GGUF, "digest": layer, "size": len(data)}]}
    store.put_manifest(ref, json.dumps(manifest).encode(), mt.OCI_MANIFEST)
    push(store, ref, None, lambda _: None, options=_options(registry))
    return layer


def test_a_pull_fetches_again_a_present_blob_that_went_bad(tmp_path: Path, registry: Registry) -> None:
    layer = _push_layer(registry, Store(tmp_path / "src"), "ai/rotten:1", os.urandom(2 << 20))
    store = Store(tmp_path / "store")
    puller = Puller(store, options=_options(registry))
    ref = parse_reference(f"{registry.host}/ai/rotten:1")
    puller.pull(ref)
    gets = registry.blob_gets("ai/rotten", layer)
    blob = store.blob_path(layer)
    flip_byte(blob)
    lines: list[dict[str, object]] = []
    puller.pull(ref, lines.append)
    assert lines[-1] == {"status": "success"}
    assert "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest() == layer  # not the bad bytes
    assert registry.blob_gets("ai/rotten", layer) == gets + 1  # fetched again
    puller.pull(ref)
    assert registry.blob_gets("ai/rotten", layer) == gets + 1  # verified and unchanged: trusted


def test_v2_load_and_verify_repair_with_a_corrupt_blob(tmp_path: Path, registry: Registry, smollm: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    src = Store(tmp_path / "src")
    name = f"{registry.host}/ai/smollm2:135m"
    src.build(parse_reference(name), smollm)
    push(src, parse_reference(name), None, lambda _: None, options=_options(registry))
    layer = "sha256:" + hashlib.sha256(smollm.read_bytes()).hexdigest()
    d = start_daemon(tmp_path / "node", extra_env={"LLMMAN_INSECURE_REGISTRIES": registry.host})
    monkeypatch.setenv("LLMMAN_HOST", d.url.removeprefix("http://"))
    try:
        with d.client() as http:
            assert http.post("/api/pull", json={"model": name, "stream": False}).status_code == 200
            blob = d.store / "blobs" / "sha256" / layer.split(":")[1]
            chat = {"model": name, "messages": [{"role": "user", "content": "Say hi."}], "stream": False,
                    "options": {"num_predict": 4}}
            flip_byte(blob, 4_000_000)  # inside the weights
            answer = http.post("/api/chat", json=chat)
            assert answer.status_code == 503 and "corrupt" in answer.json()["error"], answer.text
            assert not blob.exists()

            assert main(["verify"]) == 1  # through the daemon: reported missing
            assert "missing" in capsys.readouterr().out
            assert main(["verify", "--repair", name]) == 0
            out = capsys.readouterr().out
            assert f"repaired {name}" in out and "0 bad" not in out
            assert "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest() == layer
            assert http.post("/api/chat", json=chat).status_code == 200

            v2 = f"/v2/ai/smollm2/blobs/{layer}"
            assert http.head(v2).status_code == 200
            flip_byte(blob, 5_000_000)
            refused = http.get(v2)
            assert refused.status_code == 404 and refused.json()["errors"][0]["code"] == "BLOB_UNKNOWN"
            lines = [json.loads(x) for x in http.post("/api/verify", json={}).text.splitlines()]
            assert lines[-1]["status"] == "done" and lines[-1]["bad"] == 1
            missing = [x for x in lines if x["status"] == "missing"]
            assert [x["digest"] for x in missing] == [layer] and missing[0]["models"] == [name]
            unknown = http.post("/api/verify", json={"models": ["nope:1"]})
            assert unknown.status_code == 404
    finally:
        d.stop()
