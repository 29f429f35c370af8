"""``llmman import`` end to end with the real SmolLM2 GGUF, a real daemon and the real llama-server.

A real Ollama-shaped store (``manifests/registry.ollama.ai/library/smollm2/135m``, ``blobs/sha256-<hex>``
with template, license, system and params layers) and a real Hugging Face hub-cache repository are
built in a temp HOME; ``llmman import`` (no SOURCE: every keyword whose folder exists, found through
``OLLAMA_MODELS`` and ``HF_HUB_CACHE``) brings them into a fresh store without a copy; the daemon lists
and serves them, with the Ollama model's system prompt and parameters; ``rm`` leaves the user's files.
``store.scan_dirs`` imports at start; a source changed after the import is refused in each dialect
with the file named, never served.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from llmman.store.imports import discover, import_all
from tests.integration.daemons import start_daemon, wait_until
from tests.user_stores import hf_cache, ollama_store, sha256_file

pytestmark = [pytest.mark.integration, pytest.mark.model]

OLLAMA_NAME = "ollama.com/library/smollm2:135m"
HF_NAME = "hf.co/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1"
ASK = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def _cli(tmp: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmman", *args], env=env, cwd=tmp, capture_output=True,
                          text=True, timeout=300, check=False)


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_", "HF_", "LLAMA_"))}
    env.update(HOME=str(tmp / "home"), XDG_CONFIG_HOME=str(tmp / "home/.config"),
               XDG_CACHE_HOME=str(tmp / "home/.cache"), LLMMAN_MODELS=str(tmp / "store"), **extra)
    return env


def test_import_then_the_daemon_lists_and_serves_them(tmp_path: Path, model_file: Path) -> None:
    models = tmp_path / "elsewhere/ollama"
    ollama_store(models, model_file, system="You are terse.", params={"temperature": 0, "num_predict": 12})
    hub = tmp_path / "elsewhere/hub"
    hf_cache(hub, "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", {"SmolLM2-135M-Instruct-Q4_1.gguf": model_file})
    env = _env(tmp_path, OLLAMA_MODELS=str(models), HF_HUB_CACHE=str(hub))
    dry = _cli(tmp_path, "import", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert not (tmp_path / "store/index.json").exists()
    done = _cli(tmp_path, "import", env=env)
    assert done.returncode == 0, done.stderr
    lines = {line.split()[1]: line.split()[0] for line in done.stdout.splitlines()}
    assert lines == {OLLAMA_NAME: "imported", HF_NAME: "imported"}, done.stdout
    again = _cli(tmp_path, "import", "ollama", "hf", env=env)
    assert [line.split()[0] for line in again.stdout.splitlines()] == ["unchanged", "unchanged"]
    dry = _cli(tmp_path, "import", "-n", "ollama", env=env)  # a dry run does not claim to import it again
    assert [line.split()[0] for line in dry.stdout.splitlines()] == ["present"], dry.stdout
    assert "1 present" in dry.stderr and "would import" not in dry.stderr

    store = Store(tmp_path / "store")
    weights = models / "blobs" / f"sha256-{sha256_file(model_file)}"
    for name in (OLLAMA_NAME, HF_NAME):  # no second copy: the store's blob is the user's file
        files = store.files(store.get(parse_reference(name)), verify=False)
        assert os.path.samefile(files.model, weights)

    d = start_daemon(tmp_path)
    try:
        with d.client() as c:
            tags = {m["name"] for m in c.get("/api/tags").json()["models"]}
            assert {OLLAMA_NAME, HF_NAME} <= tags
            show = c.post("/api/show", json={"model": OLLAMA_NAME}).json()
            assert show["system"] == "You are terse." and "num_predict" in show["parameters"]
            r = c.post("/api/chat", json={"model": OLLAMA_NAME, "messages": ASK, "stream": False})
            assert r.status_code == 200, r.text
            assert "paris" in r.json()["message"]["content"].lower()
            r = c.post("/v1/chat/completions", json={"model": HF_NAME, "messages": ASK, "max_tokens": 12,
                                                     "temperature": 0})
            assert r.status_code == 200, r.text
            assert "paris" in r.json()["choices"][0]["message"]["content"].lower()
            r = c.request("DELETE", "/api/delete", json={"model": OLLAMA_NAME})
            assert r.status_code == 200, r.text
            assert OLLAMA_NAME not in {m["name"] for m in c.get("/api/tags").json()["models"]}
    finally:
        d.stop()
    assert weights.is_file() and (models / "manifests/registry.ollama.ai/library/smollm2/135m").is_file()


def test_scan_dirs_import_at_start(tmp_path: Path, model_file: Path) -> None:
    models = tmp_path / "ollama"
    ollama_store(models, model_file)
    d = start_daemon(tmp_path, extra_env={"LLMMAN_MODELS_DIRS": f"{models},{tmp_path / 'nowhere'}"})
    try:
        def listed() -> bool:
            with d.client() as c:
                return OLLAMA_NAME in {m["name"] for m in c.get("/api/tags").json()["models"]}

        wait_until(listed, "the scanned Ollama model in /api/tags")
        with d.client() as c:
            r = c.post("/api/generate", json={"model": OLLAMA_NAME, "prompt": "Hi", "stream": False,
                                              "options": {"num_predict": 4}})
            assert r.status_code == 200, r.text
        wait_until(lambda: "store.scan_dirs: 1 imported" in d.log_text(), "the scan's summary in the log")
        assert "nowhere does not exist; skipped" in d.log_text()
    finally:
        d.stop()


def test_a_changed_source_is_refused_in_every_dialect(tmp_path: Path, model_file: Path) -> None:
    models = tmp_path / "ollama"
    ollama_store(models, model_file, copy=True)  # the user's own copy, changed below
    (outcome,) = import_all(Store(tmp_path / "store"), discover(models))
    assert outcome.state == "imported"
    blob = models / "blobs" / f"sha256-{sha256_file(model_file)}"
    with blob.open("r+b") as f:  # a byte of the weights (past the header) changes after the import
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    d = start_daemon(tmp_path)
    try:
        with d.client() as c:
            answers = {
                "/api/chat": c.post("/api/chat", json={"model": OLLAMA_NAME, "messages": ASK}),
                "/v1/chat/completions": c.post("/v1/chat/completions",
                                               json={"model": OLLAMA_NAME, "messages": ASK}),
                "/v1/messages": c.post("/v1/messages", json={"model": OLLAMA_NAME, "messages": ASK,
                                                             "max_tokens": 8}),
            }
        for route, r in answers.items():
            assert r.status_code == 503, (route, r.text)
            assert "was imported from" in r.text and "llmman import" in r.text, (route, r.text)
            assert "Traceback" not in r.text, route
        assert "has changed" in answers["/api/chat"].text and str(blob) in answers["/api/chat"].text
        assert isinstance(answers["/api/chat"].json()["error"], str)
        assert answers["/v1/chat/completions"].json()["error"]["message"]
        assert answers["/v1/messages"].json()["type"] == "error"
        assert blob.is_file()  # the user's file stays; only the store's link went
        assert not d.children()
    finally:
        d.stop()


def test_an_imported_model_through_a_hop(tmp_path: Path, model_file: Path) -> None:
    """``a`` imported the Ollama model; ``b`` (peer ``a``, storing nothing) lists it and serves it in two
    dialects, forwarding to ``a`` or copying it from ``a``'s ``/v2/``, whichever its router picks."""
    models = tmp_path / "ollama"
    ollama_store(models, model_file, system="You are terse.", params={"temperature": 0, "num_predict": 12})
    (outcome,) = import_all(Store(tmp_path / "a/store"), discover(models))
    assert outcome.how == "hard link"
    a = start_daemon(tmp_path / "a", host="127.0.0.21")
    try:
        b = start_daemon(tmp_path / "b", host="127.0.0.22", extra_env={"LLMMAN_PEERS": a.url})
    except BaseException:
        a.stop()
        raise
    try:
        with b.client() as c:
            assert OLLAMA_NAME in {m["name"] for m in c.get("/api/tags").json()["models"]}
            r = c.post("/api/chat", json={"model": OLLAMA_NAME, "messages": ASK, "stream": False})
            assert r.status_code == 200, r.text
            assert "paris" in r.json()["message"]["content"].lower()
            r = c.post("/v1/messages", json={"model": OLLAMA_NAME, "messages": ASK, "max_tokens": 12,
                                             "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["content"][0]["text"].strip()
    finally:
        b.stop()
        a.stop()
    assert (models / "blobs" / f"sha256-{sha256_file(model_file)}").is_file()
