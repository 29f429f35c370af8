"""The scheduler with the real llama-server: a model file llama-server cannot load (the breaker), and
``[models."REF"]`` presets (preload, context, slots, extra arguments, keep_alive) seen on the child."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from llmman.cli.tables import processor
from llmman.gguf import read_gguf
from llmman.refs import parse_reference
from llmman.sched.healing import BREAKER_AFTER
from llmman.store import Store
from tests.integration.daemons import Daemon, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BROKEN = "docker.io/ai/broken:135m"
SMOL = "docker.io/ai/smollm2:135m"
GEMMA = "docker.io/ai/gemma3:270m"


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def ps(d: Daemon) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in httpx.get(d.url + "/api/ps", timeout=10).json()["models"]}


def write_config(tmp: Path, text: str) -> None:
    """The daemon's user config file (``$XDG_CONFIG_HOME/llmman/llmman.conf``, see daemons.start_daemon)."""
    path = tmp / "home" / ".config" / "llmman" / "llmman.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def broken_file(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 with its ``token_embd.weight`` tensor renamed: llmman's GGUF reader (and so the memory
    estimate) is happy, llama-server stops with ``error loading model: ... tensor 'token_embd.weight'
    not found``."""
    path = tmp_path_factory.mktemp("broken") / "broken.gguf"
    data = bytearray(model_file.read_bytes())
    at = data.find(b"token_embd.weight")
    assert at > 0
    data[at:at + 17] = b"token_embX.weight"
    path.write_bytes(data)
    assert read_gguf(path).context_length  # the header still reads
    return path


def spawns(d: Daemon, reference: str) -> int:
    """llama-server starts for ``reference``: one ``loading REF`` line per launch in the daemon's log."""
    return len(re.findall(rf"loading {re.escape(reference)} \(n_ctx", d.log_text()))


def cli_ps(d: Daemon) -> str:
    out = subprocess.run([sys.executable, "-m", "llmman", "ps"], env=d.env, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout


def test_a_model_llama_server_cannot_load_trips_the_breaker_and_stops_spawning(
        tmp_path: Path, broken_file: Path) -> None:
    Store(tmp_path / "store").build(parse_reference(BROKEN), broken_file)
    write_config(tmp_path, '[models."broken:135m"]\npreload = true\ncontext = 512\n')
    # Cool-downs 0.75 s, 1.5 s, 3 s, 6 s between the five loads; 9 s once the breaker is open.
    d = start_daemon(tmp_path, extra_env={"LLMMAN_RESTART_BACKOFF": "150ms", "LLMMAN_NUM_PARALLEL": "1"})
    try:
        wait_until(lambda: "breaker open" in ps(d).get(BROKEN, {}).get("failure", ""), "the breaker to open")
        row = ps(d)[BROKEN]
        assert row["processor"] == "failed (corrupt or unsupported model file)"
        assert f"failed to load {BREAKER_AFTER} time(s) in a row" in row["failure"]
        assert "token_embd.weight" in row["error"]
        assert spawns(d, BROKEN) == BREAKER_AFTER

        # During the cool-down every dialect gets 503 + Retry-After naming the cause; nothing is spawned.
        chat = {"model": "broken:135m", "messages": [{"role": "user", "content": "hi"}]}
        with d.client() as c:
            answers = {
                "ollama": c.post("/api/chat", json=chat),
                "ollama generate": c.post("/api/generate", json={"model": "broken:135m", "prompt": "hi"}),
                "openai": c.post("/v1/chat/completions", json=chat),
                "anthropic": c.post("/v1/messages", json=chat | {"max_tokens": 8}),
            }
        for dialect, r in answers.items():
            assert r.status_code == 503, (dialect, r.text)
            assert int(r.headers["Retry-After"]) >= 1, dialect
            assert "corrupt or unsupported model file" in r.text, (dialect, r.text)
            assert "breaker open" in r.text, (dialect, r.text)
        assert answers["ollama"].json()["error"].startswith(f"model {BROKEN} failed to load")
        assert answers["openai"].json()["error"]["message"].startswith(f"model {BROKEN}")
        assert answers["anthropic"].json()["type"] == "error"

        assert "failed (corrupt or unsupported model file)" in cli_ps(d)
        log = d.log_text()
        assert "stopped restarting it (breaker open)" in log and "preload of broken:135m failed" in log
        assert spawns(d, BROKEN) == BREAKER_AFTER
        assert d.children() == []
    finally:
        d.stop(signal.SIGTERM)


def test_a_copy_of_a_loaded_model_shares_its_child(tmp_path: Path, model_file: Path) -> None:
    Store(tmp_path / "store").build(parse_reference(SMOL), model_file)
    d = start_daemon(tmp_path, extra_env={"LLMMAN_NUM_PARALLEL": "1", "LLMMAN_CONTEXT_LENGTH": "1024"})
    try:
        with d.client() as c:
            assert c.post("/api/copy", json={"source": "smollm2:135m", "destination": "mine:latest"}
                          ).status_code == 200
            body = {"prompt": "The sky is", "stream": False, "options": {"num_predict": 2}}
            assert c.post("/api/generate", json={"model": "smollm2:135m", **body}).status_code == 200
            first = ps(d)
            r = c.post("/api/generate", json={"model": "mine", **body})
            assert r.status_code == 200, r.text
            now = ps(d)  # one child, shown under the name that loaded it
            assert now.keys() == {SMOL} and now[SMOL]["pid"] == first[SMOL]["pid"]
            assert len(d.children()) == 1
            r = c.post("/api/generate", json={"model": "mine", "keep_alive": 0})  # either name unloads it
            assert r.status_code == 200 and r.json()["done_reason"] == "unload"
            wait_until(lambda: ps(d) == {} and d.children() == [], "the shared child to stop")
    finally:
        d.stop(signal.SIGTERM)


def child_props(pid: int) -> dict[str, Any]:
    argv = psutil.Process(pid).cmdline()
    port = argv[argv.index("--port") + 1]
    props = httpx.get(f"http://127.0.0.1:{port}/props", timeout=10).json()
    assert isinstance(props, dict)
    return props


@pytest.fixture
def gemma_file(model_file: Path) -> Path:
    path = Path(os.environ.get("LLMMAN_TEST_GEMMA") or model_file.parent / "gemma-3-270m-q4_k_m.gguf")
    if not path.is_file():
        pytest.skip("Gemma 3 270M missing: run scripts/setup.sh --model")
    return path


@pytest.fixture
def preset_daemon(tmp_path: Path, model_file: Path, gemma_file: Path) -> Iterator[Daemon]:
    store = Store(tmp_path / "store")
    store.build(parse_reference(SMOL), model_file)
    store.build(parse_reference(GEMMA), gemma_file)
    write_config(tmp_path, (
        '[models."smollm2:135m"]\npreload = true\ncontext = 1024\nparallel = 2\nkeep_alive = "5m"\n'
        'extra_args = ["--temp", "0.25"]\n\n'
        '[models."gemma3:270m"]\ncontext = 768\nkeep_alive = "2h"\n'
    ))  # fmt: skip
    d = start_daemon(tmp_path, extra_env={"LLMMAN_NUM_PARALLEL": "1", "LLMMAN_CONTEXT_LENGTH": "2048"})
    yield d
    d.stop(signal.SIGTERM)


def test_preset_preloads_at_start_and_the_child_runs_with_its_settings(preset_daemon: Daemon) -> None:
    d = preset_daemon
    # No request is made: the preload alone loads the model.
    wait_until(lambda: ps(d).get(SMOL, {}).get("processor") == "llama-server", "the preload")
    row = ps(d)[SMOL]
    assert row["context_length"] == 1024 and row["expires_at"].startswith(("2318", "2319"))
    argv = psutil.Process(row["pid"]).cmdline()
    assert argv[argv.index("-c") + 1] == "2048" and argv[argv.index("-np") + 1] == "2"  # 1024 x 2 slots
    assert argv[-2:] == ["--temp", "0.25"]
    props = child_props(row["pid"])
    assert props["total_slots"] == 2
    assert props["default_generation_settings"]["n_ctx"] == 1024
    assert props["default_generation_settings"]["params"]["temperature"] == pytest.approx(0.25)
    assert "preloaded smollm2:135m" in d.log_text()
    (line,) = [x for x in cli_ps(d).splitlines() if x.startswith(SMOL)]  # the seeds' PROCESSOR cell
    assert processor(row) == "llama-server" and "    llama-server    " in line

    with d.client() as c:
        r = c.post("/api/generate", json={"model": "smollm2:135m", "prompt": "hi", "stream": False,
                                          "options": {"num_predict": 2}})
        assert r.status_code == 200, r.text
        after = ps(d)[SMOL]  # a request without keep_alive leaves the preloaded model pinned
        assert after["pid"] == row["pid"] and after["expires_at"].startswith(("2318", "2319"))

        r = c.post("/api/generate", json={"model": "gemma3:270m"})
        assert r.status_code == 200, r.text
    gemma = ps(d)[GEMMA]
    assert gemma["context_length"] == 768
    expires = datetime.fromisoformat(gemma["expires_at"]).astimezone(UTC)
    left = (expires - datetime.now(UTC)).total_seconds()
    assert 3600 < left <= 7200  # the preset's keep_alive of 2h, not the default 5m
    argv = psutil.Process(gemma["pid"]).cmdline()
    assert argv[argv.index("-np") + 1] == "1" and argv[argv.index("-c") + 1] == "768"
