"""Registry pieces without a network: quant selection, image-index choice, credential lookup, and the
Hugging Face pull against the local FAKE hub (tests/fakes/fake_hf_hub.py)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.fakes.fake_hf_hub import FakeHub
from tests.unit.ggufgen import write_gguf

from llmman.refs import parse_reference
from llmman.registry import manifests
from llmman.registry.client import RegistryError, RegistryNotFound
from llmman.registry.credentials import Credential, CredentialStore
from llmman.registry.huggingface import select_files
from llmman.registry.puller import Puller
from llmman.store import Store


def test_quant_selection_order_tag_shards_mmproj_license() -> None:
    files = {"m-Q8_0.gguf": 8, "m-Q4_K_M.gguf": 4, "m-Q2_K.gguf": 2, "mmproj-m-F32.gguf": 3,
             "mmproj-m-F16.gguf": 2, "LICENSE": 1, "m.imatrix.gguf": 1}
    assert select_files(files, "latest") == (["m-Q4_K_M.gguf"], "mmproj-m-F16.gguf", "LICENSE")
    assert select_files(files, "q8_0")[0] == ["m-Q8_0.gguf"]
    assert select_files({"a-F16.gguf": 9, "a-IQ3.gguf": 3}, "latest")[0] == ["a-IQ3.gguf"]
    with pytest.raises(RegistryNotFound, match=r"available: m-Q2_K\.gguf"):
        select_files(files, "Q3_K_L")
    split = {"Q4_K_M/m-Q4_K_M-00002-of-00002.gguf": 5, "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf": 5}
    assert select_files(split, "latest")[0] == sorted(split)


def test_index_choice() -> None:
    one = {"manifests": [{"digest": "sha256:" + "a" * 64}]}
    assert manifests.choose(one, "x")["digest"].endswith("a")
    arm, amd = ({"os": "linux", "architecture": a} for a in ("arm64", "amd64"))
    two = {"manifests": [{"digest": "sha256:" + "a" * 64, "platform": arm},
                         {"digest": "sha256:" + "b" * 64, "platform": amd}]}
    assert manifests.choose(two, "x")["digest"].endswith("b")
    with pytest.raises(RegistryError, match="none is clearly"):
        manifests.choose({"manifests": two["manifests"][:1] * 2}, "x")


def test_credentials_llmman_file_then_docker_config(tmp_path: Path) -> None:
    docker = tmp_path / "config.json"
    auth = base64.b64encode(b"hubuser:hubpass").decode()
    docker.write_text(json.dumps({"auths": {"https://index.docker.io/v1/": {"auth": auth}}}))
    creds = CredentialStore(tmp_path / "auth.json", docker_config=docker)
    assert creds.get("docker.io") == Credential("hubuser", "hubpass")  # bug 22: Hub aliases
    creds.save("docker.io", Credential("me", "pw"))
    assert creds.get("docker.io") == Credential("me", "pw")
    assert (tmp_path / "auth.json").stat().st_mode & 0o777 == 0o600
    assert creds.remove("docker.io") and creds.get("docker.io") == Credential("hubuser", "hubpass")
    assert creds.get("other.example") is None


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    q4, q8, proj = (tmp_path / n for n in ("q4.gguf", "q8.gguf", "proj.gguf"))
    for p in (q4, q8):
        write_gguf(p, arch="llama")
    write_gguf(proj, arch="clip")
    repo = {"tiny-Q8_0.gguf": q8.read_bytes(), "tiny-Q4_K_M.gguf": q4.read_bytes() + b"",
            "mmproj-tiny-F16.gguf": proj.read_bytes(), "LICENSE": b"MIT\n", "README.md": b"hi"}
    fake = FakeHub({"owner/tiny-GGUF": repo})
    yield fake
    fake.close()


def test_huggingface_pull_through_fake_hub(tmp_path: Path, hub: FakeHub,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    store = Store(tmp_path / "store")
    lines: list[dict[str, Any]] = []
    model = Puller(store).pull(parse_reference("hf.co/owner/tiny-GGUF"), lines.append)
    names = [layer["annotations"]["org.cncf.model.filepath"] for layer in model.manifest["layers"]]
    assert names == ["tiny-Q4_K_M.gguf", "mmproj-tiny-F16.gguf", "LICENSE"]
    assert model.manifest["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    files = store.files(model)
    assert files.mmproj is not None and files.model.read_bytes()[:4] == b"GGUF"
    assert lines[-1] == {"status": "success"}
    assert Puller(store).pull(parse_reference("hf.co/owner/tiny-GGUF:Q8_0")).reference.endswith(":Q8_0")
    with pytest.raises(RegistryNotFound):
        Puller(store).pull(parse_reference("hf.co/owner/absent"))
