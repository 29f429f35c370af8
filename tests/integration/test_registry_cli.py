"""``llmman push``/``login``/``logout`` as subprocesses against a REAL registry (Debian's docker-registry,
plain and with htpasswd basic auth over TLS), and a real daemon's ``/api/create``, ``/api/push`` and
``HEAD``/``POST /api/blobs/:digest``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from llmman.store import mediatypes as mt
from tests.integration.conftest import model_file
from tests.integration.daemons import Daemon, free_port, start_daemon
from tests.integration.registry import PASSWORD, USER, Registry, available, start_registry

__all__ = ["model_file"]

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not available(), reason="docker-registry missing")]

ACCEPT = f"{mt.OCI_MANIFEST}, application/vnd.docker.distribution.manifest.v2+json"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("secure"), secure=True)
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, registry: Registry, model_file: Path) -> Iterator[Daemon]:
    """A daemon with an empty store that may push to the plain registry and import from the model's folder."""
    env = {"LLMMAN_INSECURE_REGISTRIES": registry.host, "LLMMAN_IMPORT_DIRS": str(model_file.parent)}
    d = start_daemon(tmp_path_factory.mktemp("node"), extra_env=env)
    yield d
    d.stop(signal.SIGTERM)


def _cli(tmp: Path, *args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m llmman ARGS`` with its own HOME; no daemon answers unless ``LLMMAN_HOST`` names one."""
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_", "DOCKER_"))}
    run_env.update({"HOME": str(tmp / "home"), "XDG_CONFIG_HOME": str(tmp / "home" / ".config"),
                    "LLMMAN_HOST": f"127.0.0.1:{free_port()}", "LLMMAN_MODELS": str(tmp / "store")} | env)
    return subprocess.run([sys.executable, "-m", "llmman", *args], env=run_env, cwd=tmp, input=stdin,
                          capture_output=True, text=True, timeout=120, check=False)


def _remote_digest(reg: Registry, repository: str, tag: str, auth: tuple[str, str] | None = None) -> str:
    """The manifest digest the registry serves for ``repository:tag`` (fails the test when absent)."""
    scheme = "https" if reg.ca else "http"
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(reg.ca)) if reg.ca else True
    r = httpx.get(f"{scheme}://{reg.host}/v2/{repository}/manifests/{tag}", headers={"Accept": ACCEPT},
                  auth=auth, verify=verify, timeout=30)
    assert r.status_code == 200, r.text
    return "sha256:" + hashlib.sha256(r.content).hexdigest()


def _lines(response: httpx.Response) -> list[dict[str, object]]:
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def test_cli_push_from_the_store(tmp_path: Path, registry: Registry, model_file: Path) -> None:
    ref = parse_reference(f"{registry.host}/ai/smollm2:cli")
    digest = Store(tmp_path / "store").build(ref, model_file).digest
    done = _cli(tmp_path, "push", "--store", str(tmp_path / "store"), "--insecure", str(ref))
    assert done.returncode == 0, done.stderr
    assert "success" in done.stdout.splitlines()
    assert _remote_digest(registry, "ai/smollm2", "cli") == digest

    again = _cli(tmp_path, "push", "--store", str(tmp_path / "store"), "--insecure", str(ref))
    assert again.returncode == 0, again.stderr  # every blob already there: still a success

    missing = _cli(tmp_path, "push", "--store", str(tmp_path / "store"), "--insecure",
                   f"{registry.host}/ai/nothing:here")
    assert missing.returncode == 1 and "not found" in missing.stderr and "Traceback" not in missing.stderr


def test_login_push_logout_with_basic_auth_over_tls(tmp_path: Path, secure: Registry,
                                                    model_file: Path) -> None:
    assert secure.ca is not None
    env = {"LLMMAN_TLS_CA": str(secure.ca), "LLMMAN_AUTH_FILE": str(tmp_path / "auth.json")}
    store = tmp_path / "store"
    ref = parse_reference(f"{secure.host}/ai/smollm2:login")
    digest = Store(store).build(ref, model_file).digest
    push = ("push", "--store", str(store), str(ref))

    refused = _cli(tmp_path, "login", secure.host, "-u", USER, "--password-stdin", stdin="wrong\n", **env)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "401" in refused.stderr or "unauthorized" in refused.stderr.lower()
    assert not (tmp_path / "auth.json").exists()

    anonymous = _cli(tmp_path, *push, **env)
    assert anonymous.returncode == 1 and "Traceback" not in anonymous.stderr
    assert "auth" in anonymous.stderr.lower() or "401" in anonymous.stderr

    ok = _cli(tmp_path, "login", secure.host, "-u", USER, "--password-stdin", stdin=PASSWORD + "\n", **env)
    assert ok.returncode == 0, ok.stderr
    assert f"Login succeeded for {secure.host}" in ok.stdout
    assert secure.host in (tmp_path / "auth.json").read_text()

    pushed = _cli(tmp_path, *push, **env)
    assert pushed.returncode == 0, pushed.stderr
    assert _remote_digest(secure, "ai/smollm2", "login", auth=(USER, PASSWORD)) == digest

    out = _cli(tmp_path, "logout", f"https://{secure.host}/v2/", **env)  # Docker's URL form works too
    assert out.returncode == 0 and f"Logged out of {secure.host}" in out.stdout
    assert secure.host not in (tmp_path / "auth.json").read_text()
    after = _cli(tmp_path, *push, **env)
    assert after.returncode == 1 and "Traceback" not in after.stderr
    twice = _cli(tmp_path, "logout", secure.host, **env)
    assert twice.returncode == 1 and "not logged in" in twice.stderr


def test_create_from_a_server_path_then_cli_push_through_the_daemon(node: Daemon, registry: Registry,
                                                                  model_file: Path, tmp_path: Path) -> None:
    name = f"{registry.host}/ai/made:path"
    with node.client() as c:
        r = c.post("/api/create", json={"model": name, "from": str(model_file)})
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = _lines(r)
        assert lines[0] == {"status": "parsing model"} and lines[-1] == {"status": "success"}
        assert name in {m["name"] for m in c.get("/api/tags").json()["models"]}
        missing = c.post("/api/create", json={"model": "x:1", "from": str(model_file.parent / "none.gguf"),
                                              "stream": False})
        assert missing.status_code == 404 and "no such file" in missing.json()["error"]
        neither = c.post("/api/create", json={"model": "x:1", "stream": False})
        assert neither.status_code == 400 and "error" in neither.json()
    digest = Store(node.store).get(parse_reference(name)).digest

    done = _cli(tmp_path, "push", name, LLMMAN_HOST=node.url.removeprefix("http://"))
    assert done.returncode == 0, done.stderr
    assert "success" in done.stdout.splitlines()
    assert _remote_digest(registry, "ai/made", "path") == digest


def test_blobs_head_upload_mismatch_and_create_from_files(node: Daemon, model_file: Path) -> None:
    data = model_file.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    wrong = "sha256:" + hashlib.sha256(b"something else").hexdigest()
    with node.client() as c:
        assert c.head(f"/api/blobs/{wrong}").status_code == 404
        bad = c.post(f"/api/blobs/{wrong}", content=b"these bytes are not that digest")
        assert bad.status_code == 400 and "mismatch" in bad.json()["error"]
        assert c.head(f"/api/blobs/{wrong}").status_code == 404
        assert c.head("/api/blobs/sha256:nothex").status_code == 400
        assert c.post("/api/blobs/md5:00", content=b"x").status_code == 400

        def create(files: dict[str, object]) -> httpx.Response:
            return c.post("/api/create", json={"model": "fromblobs:1", "files": files, "stream": False})

        gone = create({"m.gguf": wrong})
        assert gone.status_code == 404 and wrong in gone.json()["error"]
        for files in ({"m.gguf": "bad"}, {"m.gguf": 5}, {"": wrong}, {"..": wrong}, {"a/m.gguf": wrong}):
            r = create(files)
            assert r.status_code == 400 and "error" in r.json(), (files, r.text)

        up = c.post(f"/api/blobs/{digest}", content=data)
        assert up.status_code == 201, up.text
        assert c.head(f"/api/blobs/{digest}").status_code == 200
        assert c.head(f"/api/blobs/{digest.replace(':', '-')}").status_code == 200  # Ollama's file form

        made = create({"model.gguf": digest.replace(":", "-")})
        assert made.status_code == 200 and made.json() == {"status": "success"}
        shown = c.post("/api/show", json={"model": "fromblobs:1"}).json()
        assert "completion" in shown["capabilities"]
        reply = c.post("/api/generate", json={"model": "fromblobs:1", "prompt": "Hi", "stream": False,
                                              "options": {"num_predict": 2}, "keep_alive": 0})
        assert reply.status_code == 200 and reply.json()["eval_count"] > 0
