"""Fault catalogue: server-path imports and hostile GGUFs (issue 13 items 8 and 9), against a real
``llmman serve`` (the fake llama-server as its child; nothing here runs a model).

Before: ``POST /api/create {"from": "/etc/shadow"}`` told whether the file existed (404 against a GGUF
error), imported any GGUF on the machine, and copied a README or LICENSE beside it into the store, where
``/v2`` served it; a GGUF header with 20 000 nested arrays was a RecursionError: a 500 from the route and a
traceback from ``llmman build``. Now a server path is read only under ``server.import_dirs`` (empty by
default), one 403 answers every other path, symlinks and ``..`` are resolved first, files of an allowed
folder that resolve outside it are left out, and a hostile header is a 400 / a clean CLI error.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.daemons import Daemon
from tests.integration.test_faults_fake import fake_daemon
from tests.unit.ggufgen import write_gguf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = b"root:$6$not-for-the-store:19000:0:99999:7:::\n"


def hostile_gguf(path: Path, levels: int = 20_000) -> Path:
    """A GGUF whose one KV is an array of an array of ... ``levels`` deep."""
    head = struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + struct.pack("<Q", 1) + b"x" + struct.pack("<I", 9)
    path.write_bytes(head + struct.pack("<IQ", 9, 1) * levels + struct.pack("<IQ", 4, 0) + b"\0" * 64)
    return path


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``allowed/`` (a GGUF, a model folder whose README is a symlink out, a link to ``outside/``, a
    hostile GGUF) and ``outside/`` (a GGUF and a secret)."""
    root = tmp_path_factory.mktemp("tree")
    allowed, outside = root / "allowed", root / "outside"
    (allowed / "folder").mkdir(parents=True)
    outside.mkdir()
    (outside / "shadow").write_bytes(SECRET)
    write_gguf(outside / "secret.gguf", name="Outside")
    write_gguf(allowed / "model.gguf", name="Allowed")
    write_gguf(allowed / "folder" / "m.gguf", name="Folder")
    (allowed / "folder" / "LICENSE").write_text("MIT, from inside\n")
    (allowed / "folder" / "README.md").symlink_to(outside / "shadow")
    (allowed / "out").symlink_to(outside)
    hostile_gguf(allowed / "hostile.gguf")
    return {"root": root, "allowed": allowed, "outside": outside}


@pytest.fixture(scope="module")
def closed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The default: no import directory."""
    d = fake_daemon(tmp_path_factory.mktemp("closed"), {})
    yield d
    d.stop()


@pytest.fixture(scope="module")
def open_(tmp_path_factory: pytest.TempPathFactory, tree: dict[str, Path]) -> Iterator[Daemon]:
    d = fake_daemon(tmp_path_factory.mktemp("open"), {"LLMMAN_IMPORT_DIRS": str(tree["allowed"])})
    yield d
    d.stop()


def _create(d: Daemon, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(d.url + "/api/create", json={"stream": False, **body}, timeout=60)


def _store_holds(d: Daemon, data: bytes) -> bool:
    blobs = d.store / "blobs" / "sha256"
    small = [p for p in blobs.iterdir() if p.stat().st_size < 1 << 20] if blobs.is_dir() else []
    return any(p.read_bytes() == data for p in small)


def test_no_server_path_by_default_and_no_existence_oracle(closed: Daemon, tree: dict[str, Path]) -> None:
    answers = [_create(closed, {"model": f"x:{i}", "from": path}) for i, path in enumerate([
        "/etc/shadow", "/etc/passwd", "/no/such/file.gguf", str(tree["outside"] / "secret.gguf"),
        str(tree["allowed"] / "model.gguf")])]
    assert {(r.status_code, r.text) for r in answers} == {(403, answers[0].text)}, [r.text for r in answers]
    assert "server.import_dirs" in answers[0].json()["error"] and "/api/blobs" in answers[0].json()["error"]
    streamed = httpx.post(closed.url + "/api/create", json={"model": "x:9", "from": "/etc/shadow"},
                          timeout=60)
    assert streamed.status_code == 403  # judged before the progress stream starts
    assert not _store_holds(closed, SECRET)


def test_blob_upload_stays_the_normal_way(closed: Daemon, tree: dict[str, Path]) -> None:
    data = (tree["allowed"] / "model.gguf").read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert httpx.post(f"{closed.url}/api/blobs/{digest}", content=data, timeout=60).status_code == 201
    r = _create(closed, {"model": "uploaded:1", "files": {"model.gguf": digest}})
    assert r.status_code == 200 and r.json() == {"status": "success"}, r.text


def test_allowed_directory_imports(open_: Daemon, tree: dict[str, Path]) -> None:
    r = _create(open_, {"model": "allowed:1", "from": str(tree["allowed"] / "model.gguf")})
    assert (r.status_code, r.json()) == (200, {"status": "success"}), r.text
    missing = _create(open_, {"model": "x:1", "from": str(tree["allowed"] / "none.gguf")})
    assert missing.status_code == 404 and "no such file" in missing.json()["error"]


@pytest.mark.parametrize("escape", ["allowed/../outside/secret.gguf", "allowed/out/secret.gguf",
                                    "allowed/out/../outside/shadow", "outside/shadow", "allowed/../../etc"])
def test_dot_dot_and_symlinks_out_are_refused(open_: Daemon, tree: dict[str, Path], escape: str) -> None:
    r = _create(open_, {"model": "esc:1", "from": f"{tree['root']}/{escape}"})
    assert r.status_code == 403, r.text
    assert "server.import_dirs" in r.json()["error"]


def test_a_folder_leaves_out_files_that_resolve_outside(open_: Daemon, tree: dict[str, Path]) -> None:
    r = _create(open_, {"model": "folder:1", "from": str(tree["allowed"] / "folder")})
    assert (r.status_code, r.json()) == (200, {"status": "success"}), r.text
    show = httpx.post(open_.url + "/api/show", json={"model": "folder:1"}, timeout=30)
    assert show.status_code == 200, show.text
    manifest = httpx.get(open_.url + "/v2/ai/folder/manifests/1", timeout=30)
    names = {layer["annotations"]["org.opencontainers.image.title"] for layer in manifest.json()["layers"]}
    assert names == {"m.gguf", "LICENSE"}, names
    assert not _store_holds(open_, SECRET)


def test_hostile_gguf_is_a_400_not_a_500(open_: Daemon, tree: dict[str, Path]) -> None:
    r = _create(open_, {"model": "hostile:1", "from": str(tree["allowed"] / "hostile.gguf")})
    assert r.status_code == 400 and "nested" in r.json()["error"], r.text
    data = (tree["allowed"] / "hostile.gguf").read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert httpx.post(f"{open_.url}/api/blobs/{digest}", content=data, timeout=60).status_code == 201
    up = _create(open_, {"model": "hostile:2", "files": {"h.gguf": digest}})
    assert up.status_code == 400 and "nested" in up.json()["error"], up.text


def test_hostile_gguf_is_a_clean_build_error(tmp_path: Path) -> None:
    path = hostile_gguf(tmp_path / "hostile.gguf")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_"))}
    env.update(HOME=str(tmp_path), LLMMAN_MODELS=str(tmp_path / "store"), XDG_CONFIG_HOME=str(tmp_path / "c"))
    done = subprocess.run([sys.executable, "-m", "llmman", "build", "-t", "hostile:1", str(path)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "nested more than" in done.stderr and "Traceback" not in done.stderr, done.stderr
