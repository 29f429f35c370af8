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

from llmman.config.settings import Settings, load_settings
from llmman.errors import ConfigError, LlmmanError
from llmman.refs import parse_reference
from llmman.registry import manifests
from llmman.registry.client import RegistryClient, RegistryError, RegistryNotFound, RegistryOptions
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
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")  # huggingface_hub's own switch, read by it
    store = Store(tmp_path / "store")
    puller = Puller(store, options=RegistryOptions(hf_endpoint=hub.url))
    lines: list[dict[str, Any]] = []
    model = puller.pull(parse_reference("hf.co/owner/tiny-GGUF"), lines.append)
    names = [layer["annotations"]["org.cncf.model.filepath"] for layer in model.manifest["layers"]]
    assert names == ["tiny-Q4_K_M.gguf", "mmproj-tiny-F16.gguf", "LICENSE"]
    assert model.manifest["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    files = store.files(model)
    assert files.mmproj is not None and files.model.read_bytes()[:4] == b"GGUF"
    assert lines[-1] == {"status": "success"}
    assert puller.pull(parse_reference("hf.co/owner/tiny-GGUF:Q8_0")).reference.endswith(":Q8_0")
    with pytest.raises(RegistryNotFound):
        puller.pull(parse_reference("hf.co/owner/absent"))


def test_range_decisions_follow_rfc_9110() -> None:
    from llmman.api.byteranges import decide

    assert decide(None, 10).ranges is None
    assert decide("bytes=0-3", 10).header() == "bytes=0-3"
    assert decide("bytes=8-", 10).header() == "bytes=8-9"
    assert decide("bytes=5-100", 10).header() == "bytes=5-9"
    assert decide("bytes=-4", 10).header() == "bytes=6-9"
    assert decide("BYTES=0-0, 20-30", 10).header() == "bytes=0-0"  # the unsatisfiable part dropped
    for invalid in ("bytes=abc", "bytes=5-3", "items=0-1", "bytes", "bytes=", "bytes=1-2-3", "bytes=--1"):
        assert decide(invalid, 10).ranges is None, invalid  # ignored: the whole blob, 200
    for unsatisfiable in ("bytes=10-", "bytes=11-20", "bytes=-0", "bytes=10-12,-0"):
        assert decide(unsatisfiable, 10).unsatisfiable, unsatisfiable


@pytest.fixture(scope="module")
def v2_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.fakes.inprocess import InProcessApp

    with InProcessApp(tmp_path_factory.mktemp("v2")) as app:
        for tag in ("b", "a", "c"):
            app.store.tag(parse_reference("tiny"), parse_reference(f"tiny:{tag}"))
        yield app


def test_v2_blob_ranges_never_a_plain_text_400(v2_app: Any) -> None:
    model = v2_app.store.get(parse_reference("tiny"))
    layer = model.manifest["layers"][0]
    url = f"/v2/ai/tiny/blobs/{layer['digest']}"
    whole = v2_app.request("GET", url)
    assert whole.status_code == 200 and len(whole.content) == layer["size"]
    for bad in ("bytes=abc", "bytes=9-2", "lines=1-2"):
        r = v2_app.request("GET", url, headers={"Range": bad})
        assert r.status_code == 200 and r.content == whole.content, bad
    r = v2_app.request("GET", url, headers={"Range": "bytes=0-3"})
    assert r.status_code == 206 and r.content == b"GGUF"
    r = v2_app.request("GET", url, headers={"Range": f"bytes={layer['size']}-"})
    assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{layer['size']}"
    assert r.json()["errors"][0]["code"] == "RANGE_INVALID"
    r = v2_app.request("GET", "/v2/ai/tiny/blobs/sha256:nothex")
    assert r.status_code in (400, 404) and "errors" in r.json()


def test_v2_tags_list_with_pagination_and_oci_errors(v2_app: Any) -> None:
    r = v2_app.request("GET", "/v2/ai/tiny/tags/list")
    assert r.status_code == 200 and r.json() == {"name": "ai/tiny", "tags": ["a", "b", "c", "latest"]}
    r = v2_app.request("GET", "/v2/ai/tiny/tags/list?n=2")
    assert r.json()["tags"] == ["a", "b"]
    assert r.headers["link"] == '</v2/ai/tiny/tags/list?n=2&last=b>; rel="next"'
    r = v2_app.request("GET", "/v2/ai/tiny/tags/list?n=2&last=b")
    assert r.json()["tags"] == ["c", "latest"] and "link" not in r.headers
    assert v2_app.request("GET", "/v2/ai/tiny/tags/list?n=0").json()["tags"] == []
    r = v2_app.request("GET", "/v2/ai/tiny/tags/list?n=-1")
    assert r.status_code == 400 and r.json()["errors"][0]["code"] == "PAGINATION_NUMBER_INVALID"
    r = v2_app.request("GET", "/v2/ai/none/tags/list")
    assert r.status_code == 404 and r.json()["errors"][0]["code"] == "NAME_UNKNOWN"
    r = v2_app.request("GET", "/v2/ai/tiny/manifests/nope")
    assert r.status_code == 404 and r.json() == {"errors": [{"code": "MANIFEST_UNKNOWN",
                                                             "message": "manifest ai/tiny:nope not found"}]}


def test_long_or_malformed_names_are_400_on_every_name_route(v2_app: Any) -> None:
    long = "a" * 5000
    bodies = {"/api/pull": {"model": long}, "/api/push": {"model": long},
              "/api/create": {"model": long, "from": "tiny"}, "/api/show": {"model": long},
              "/api/copy": {"source": long, "destination": "x:1"}}
    for path, body in bodies.items():
        r = v2_app.request("POST", path, json={**body, "stream": False})
        assert r.status_code == 400 and r.json()["error"].startswith("invalid model name"), (path, r.text)
        assert len(r.json()["error"]) < 300, path  # the name is not echoed in full
    r = v2_app.request("POST", "/api/copy", json={"source": "tiny", "destination": "x" * 300})
    assert r.status_code == 400 and "invalid model name" in r.json()["error"]
    r = v2_app.request("DELETE", "/api/delete", json={"model": "bad name!"})
    assert r.status_code == 400 and "invalid model name" in r.json()["error"]
    assert parse_reference("a" * 200).repository == "ai/" + "a" * 200


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"parameters": {"temperature": "hot"}}, 400, 'option "temperature" must be of type float'),
    ({"parameters": {"bogus": 1}}, 400, "unknown parameter 'bogus'"),
    ({"parameters": [1]}, 400, "parameters must be an object"),
    ({"from": 3}, 400, "from must be a string"),
    ({"files": ["a"]}, 400, "files must be an object"),
    ({"quantize": 4}, 400, "quantize must be a string"),
    ({"messages": "hi"}, 400, "messages must be an array"),
    ({"license": {"a": 1}}, 400, "license must be a string"),
    ({"stream": "no"}, 400, "stream must be a boolean"),
    ({"template": "{{ .Prompt }}"}, 501, "'template' in /api/create is not supported"),
    ({"adapters": {"a.gguf": "sha256:" + "0" * 64}}, 501, "'adapters' in /api/create is not supported"),
    ({"quantize": "q4_K_M"}, 501, "'quantize' in /api/create is not supported"),
])
def test_create_checks_every_field(v2_app: Any, body: dict[str, Any], status: int, words: str) -> None:
    r = v2_app.request("POST", "/api/create",
                       json={"model": "made:1", "from": "tiny", "stream": False, **body})
    assert r.status_code == status and words in r.json()["error"], r.text
    assert v2_app.store.find(parse_reference("made:1")) is None


def test_create_with_empty_optional_fields_still_works(v2_app: Any) -> None:
    body = {"model": "made:2", "from": "tiny", "stream": False, "parameters": {}, "system": "", "files": {}}
    r = v2_app.request("POST", "/api/create", json=body)
    assert r.status_code == 200, r.text
    assert v2_app.store.find(parse_reference("made:2")) is not None


def _settings(tmp_path: Path, env: dict[str, str]) -> Settings:
    return load_settings(env={"HOME": str(tmp_path), **env}, system_file=tmp_path / "none",
                         user_file=tmp_path / "none")


def test_registry_options_come_from_the_settings_not_the_environment(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMMAN_INSECURE_REGISTRIES", "env-only.lan:5000")  # the process's: not read here
    monkeypatch.setenv("LLMMAN_TLS_CA", str(tmp_path / "absent.pem"))
    assert RegistryClient("env-only.lan:5000").base == "https://env-only.lan:5000"

    settings = _settings(tmp_path, {"LLMMAN_INSECURE_REGISTRIES": "Reg.LAN:5000, other.lan",
                                    "HF_ENDPOINT": "http://127.0.0.1:9/"})
    options = RegistryOptions.of(settings)
    assert options == RegistryOptions(("Reg.LAN:5000", "other.lan"), "", "http://127.0.0.1:9")
    plain = RegistryClient("reg.lan:5000", options=options)
    assert (plain.base, plain.tls) == ("http://reg.lan:5000", None)
    secure = RegistryClient("third.lan", options=options)
    assert secure.base == "https://third.lan" and secure.tls is not None
    for client in (plain, secure):
        client.close()


def test_a_registry_client_trusts_the_configured_ca_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="LLMMAN_TLS_CA="):
        RegistryClient("reg.lan", options=RegistryOptions(ca_file=str(bad)))
    client = RegistryClient("reg.lan")
    client.trust("")  # nothing configured: nothing to load
    with pytest.raises(ConfigError, match="LLMMAN_TLS_CA="):
        client.trust(str(bad))
    client.close()
    plain = RegistryClient("reg.lan", insecure=True)
    plain.trust(str(bad))  # plain HTTP has no TLS to configure
    plain.close()


def test_credentials_come_from_the_configured_files(tmp_path: Path) -> None:
    docker = tmp_path / "dockercfg"
    docker.mkdir()
    auth = base64.b64encode(b"dockeruser:pw").decode()
    (docker / "config.json").write_text(json.dumps({"auths": {"reg.lan": {"auth": auth}}}))
    settings = _settings(tmp_path, {"LLMMAN_AUTH_FILE": str(tmp_path / "mine.json"),
                                    "DOCKER_CONFIG": str(docker)})
    creds = CredentialStore.of(settings)
    assert (creds.path, creds.docker_config) == (tmp_path / "mine.json", docker / "config.json")
    assert creds.get("reg.lan") == Credential("dockeruser", "pw")
    creds.save("reg.lan", Credential("me", "pw2"))
    assert json.loads((tmp_path / "mine.json").read_text())["auths"]["reg.lan"]
    assert creds.get("reg.lan") == Credential("me", "pw2")
    assert CredentialStore(tmp_path / "none.json").get("reg.lan") is None  # no Docker config named: none read


def test_offline_hugging_face_follows_the_configured_endpoint(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    with pytest.raises(LlmmanError, match="offline") as err:
        Puller(store, offline=True).ensure(parse_reference("hf.co/owner/repo"))
    assert "huggingface.co" in err.value.message
    local = Puller(store, offline=True, options=RegistryOptions(hf_endpoint="http://127.0.0.1:9"))
    with pytest.raises(LlmmanError) as err:  # a hub on this machine is tried: unreachable, not "offline"
        local.ensure(parse_reference("hf.co/owner/repo"))
    assert "offline" not in err.value.message
