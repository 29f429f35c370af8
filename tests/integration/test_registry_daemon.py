"""Pull through real daemons: ``/api/pull`` progress, pull-on-demand, ``/v2/`` between nodes, the CLI.

A real registry holds SmolLM2 (pushed by the store-level tests' recipe) and Gemma 3 270M (as a ModelPack
and as a Docker model artifact); daemons run with ``LLMMAN_INSECURE_REGISTRIES`` naming it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from llmman.refs import parse_reference
from llmman.registry.push import push
from llmman.store import Store
from tests.integration.daemons import Daemon, free_port, start_daemon
from tests.integration.registry import Registry, available, docker_artifact, gemma_file, start_registry

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not available(), reason="docker-registry missing")]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    mp = pytest.MonkeyPatch()
    mp.setenv("LLMMAN_INSECURE_REGISTRIES", reg.host)
    store = Store(tmp_path_factory.mktemp("src") / "store")
    for tag in ("135m", "ondemand"):
        ref = parse_reference(f"{reg.host}/ai/smollm2:{tag}")
        store.build(ref, model_file)
        push(store, ref, None, lambda _: None)
    mp.undo()
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def gemma(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Gemma 3 270M pushed as ModelPack (``ai/gemma3:270m``) and Docker artifact (``ai/gemma3:docker``);
    returns name -> manifest digest."""
    path = gemma_file()
    mp = pytest.MonkeyPatch()
    mp.setenv("LLMMAN_INSECURE_REGISTRIES", registry.host)
    store = Store(tmp_path_factory.mktemp("gemma") / "store")
    pack = parse_reference(f"{registry.host}/ai/gemma3:270m")
    dock = parse_reference(f"{registry.host}/ai/gemma3:docker")
    digests = {str(pack): store.build(pack, path).digest, str(dock): docker_artifact(store, dock, path)}
    for ref in (pack, dock):
        assert push(store, ref, None, lambda _: None) == digests[str(ref)]
    mp.undo()
    return digests


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Daemon]:
    env = {"LLMMAN_INSECURE_REGISTRIES": registry.host,
           "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # a Hugging Face nobody serves
    d = start_daemon(tmp_path_factory.mktemp("node"), extra_env=env)
    yield d
    d.stop(signal.SIGTERM)


def _lines(response: httpx.Response) -> list[dict[str, object]]:
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def test_api_pull_streams_ollama_progress(node: Daemon, registry: Registry) -> None:
    name = f"{registry.host}/ai/smollm2:135m"
    with node.client() as c:
        r = c.post("/api/pull", json={"model": name})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = _lines(r)
        assert lines[0] == {"status": "pulling manifest"}
        assert lines[-3:] == [{"status": "verifying sha256 digest"}, {"status": "writing manifest"},
                              {"status": "success"}]
        layers = [line for line in lines if "digest" in line]
        assert layers and all(set(line) == {"status", "digest", "total", "completed"} for line in layers)
        assert all(str(line["status"]).startswith("pulling ") for line in layers)
        assert c.post("/api/pull", json={"model": name, "stream": False}).json() == {"status": "success"}
        assert name in [m["name"] for m in c.get("/api/tags").json()["models"]]
        r = c.post("/api/pull", json={"model": f"{registry.host}/ai/absent:1", "stream": False})
        assert r.status_code == 404 and "not found" in r.json()["error"]
        r = c.post("/api/pull", json={"model": f"{registry.host}/ai/absent:1"})
        assert r.status_code == 200 and "error" in _lines(r)[-1]


def test_pull_on_demand_once_then_served(node: Daemon, registry: Registry) -> None:
    name = f"{registry.host}/ai/smollm2:ondemand"
    layer = "sha256:b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # the SmolLM2 GGUF
    with node.client() as c:  # start from a store without that layer
        for m in c.get("/api/tags").json()["models"]:
            c.request("DELETE", "/api/delete", json={"model": m["name"]})
    gets = registry.blob_gets("ai/smollm2", layer)
    body = {"model": name, "prompt": "Say hi", "stream": False, "options": {"num_predict": 4}}
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: httpx.post(node.url + "/api/generate", json=body, timeout=300),
                                range(3)))
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert all(a.json()["done"] for a in answers)
    assert registry.blob_gets("ai/smollm2", layer) == gets + 1  # three requests, one download
    manifests = json.loads((node.store / "index.json").read_text())["manifests"]
    names = [m["annotations"]["org.opencontainers.image.ref.name"] for m in manifests]
    assert names.count(name) == 1


def test_unpullable_model_is_a_quick_404(node: Daemon, registry: Registry) -> None:
    with node.client() as c:
        hi = [{"role": "user", "content": "hi"}]
        r = c.post("/api/chat", json={"model": f"{registry.host}/ai/none:1", "messages": hi})
        assert r.status_code == 404
        assert r.json()["error"].startswith(f"model '{registry.host}/ai/none:1' not found: ")
        r = c.post("/v1/chat/completions", json={"model": "127.0.0.1:1/ai/x:1", "messages": hi})
        assert r.status_code == 404 and "not found" in r.json()["error"]["message"]


def test_node_pulls_from_another_nodes_v2(node: Daemon, registry: Registry,
                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    with node.client() as c:
        assert c.post("/api/pull", json={"model": f"{registry.host}/ai/smollm2:135m", "stream": False}
                      ).status_code == 200
        assert c.get("/v2/").headers["docker-distribution-api-version"] == "registry/2.0"
        m = c.get("/v2/ai/smollm2/manifests/135m")
        assert m.status_code == 200
        layer = json.loads(m.content)["layers"][0]["digest"]
        part = c.get(f"/v2/ai/smollm2/blobs/{layer}", headers={"Range": "bytes=0-3"})
        assert part.status_code == 206 and part.content == b"GGUF"
        assert c.get("/v2/ai/nothing/manifests/1").status_code == 404
    peer_host = node.url.removeprefix("http://")
    peer = start_daemon(tmp_path_factory.mktemp("peer"), extra_env={"LLMMAN_INSECURE_REGISTRIES": peer_host})
    try:
        with peer.client() as c:
            r = c.post("/api/pull", json={"model": f"{peer_host}/ai/smollm2:135m", "stream": False})
            assert r.status_code == 200, r.text
            got = {m["name"]: m["digest"] for m in c.get("/api/tags").json()["models"]}
        with node.client() as c:
            want = {m["name"]: m["digest"] for m in c.get("/api/tags").json()["models"]}
        assert got[f"{peer_host}/ai/smollm2:135m"] == want[f"{registry.host}/ai/smollm2:135m"]
    finally:
        peer.stop(signal.SIGTERM)


def test_cli_pull_without_daemon(tmp_path: Path, registry: Registry, node: Daemon) -> None:
    env = {**node.env, "LLMMAN_HOST": "127.0.0.1:1", "LLMMAN_INSECURE_REGISTRIES": registry.host}
    store = tmp_path / "store"
    out = subprocess.run([sys.executable, "-m", "llmman", "--store", str(store), "pull",
                          f"{registry.host}/ai/smollm2:135m"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "success" in out.stdout
    again = subprocess.run([sys.executable, "-m", "llmman", "--store", str(store), "pull",
                            f"{registry.host}/ai/smollm2:135m"], env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0 and "Already have" in again.stdout + again.stderr
    bad = subprocess.run([sys.executable, "-m", "llmman", "--store", str(store), "pull",
                          f"{registry.host}/ai/absent:1"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 1 and "not found" in bad.stderr


def test_gemma_both_artifact_kinds_pulled_back_and_served(node: Daemon, gemma: dict[str, str]) -> None:
    with node.client() as c:
        for name, digest in gemma.items():
            r = c.post("/api/pull", json={"model": name, "stream": False})
            assert r.status_code == 200, r.text
            tags = {m["name"]: m["digest"] for m in c.get("/api/tags").json()["models"]}
            assert tags[name] == digest.removeprefix("sha256:")  # the digest that was pushed
            body = {"model": name, "prompt": "Say hi", "stream": False, "options": {"num_predict": 4}}
            answer = c.post("/api/generate", json=body, timeout=300)
            assert answer.status_code == 200, answer.text
            assert answer.json()["done"] is True and answer.json()["eval_count"] >= 1


def test_cli_stop_never_pulls_and_unreachable_hugging_face_is_clear(node: Daemon) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "llmman", *args], env=node.env, capture_output=True,
                              text=True, timeout=120)

    with node.client() as c:  # an unload of a model not stored: 404 without a pull's reason
        r = c.post("/api/generate", json={"model": "nosuch", "keep_alive": 0})
        assert r.status_code == 404 and r.json() == {"error": "model 'nosuch' not found"}
    out = cli("stop", "nosuch")
    assert out.returncode == 1 and 'couldn\'t find model "nosuch" to unload' in out.stderr, out.stderr
    out = cli("run", "hf.co/owner/repo", "hi")
    assert out.returncode == 1 and "cannot reach http://127.0.0.1:" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr + node.log.read_text(errors="replace")
