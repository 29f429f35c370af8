"""Attacks on this session's routes and load options with real daemons and the real llama-server
(helper H9): what a hostile or careless client sends gets a clear 400 in its dialect, no child is started
for it, and the model stays usable for everyone else, on the node that stores the model and through a
hop (a front node storing nothing forwards to it)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from tests.integration.daemons import Daemon, Nodes, hop_pair
from tests.integration.derived_ggufs import FIM_NAME, RERANK_NAME, write_fim_model, write_rerank_model

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    model = os.environ.get("LLMMAN_TEST_MODEL")
    if not model:
        pytest.skip("LLMMAN_TEST_MODEL is not set")
    hosts = "127.0.0.61", "127.0.0.62"
    back_tmp, front_tmp = tmp_path_factory.mktemp("back"), tmp_path_factory.mktemp("front")
    store = Store(back_tmp / "store")
    store.build(parse_reference("smollm2:135m"), Path(model))
    store.build(parse_reference(RERANK_NAME), write_rerank_model(Path(model), back_tmp / "rerank.gguf"))
    (back_tmp / "rerank.gguf").unlink()
    store.build(parse_reference(FIM_NAME), write_fim_model(Path(model), back_tmp / "fim.gguf"))
    (back_tmp / "fim.gguf").unlink()
    with hop_pair(back_tmp, front_tmp, hosts) as pair:
        yield pair


def ollama(d: Daemon, route: str, options: dict[str, Any]) -> httpx.Response:
    body: dict[str, Any] = {"model": "smollm2:135m", "stream": False,
                            "options": {"num_predict": 2, **options}}
    if route == "/api/chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return httpx.post(d.url + route, json=body, timeout=120)


@pytest.mark.parametrize("via", ["back", "front"])
@pytest.mark.parametrize("route", ["/api/generate", "/api/chat"])
def test_a_thread_count_that_kills_the_child_is_a_400(nodes: Nodes, via: str, route: str) -> None:
    """num_thread 100 000 made llama-server die with SIGSEGV while loading: the client got a 500 and
    every other client a 503 for the model's retry pause. Now it is refused before any load."""
    before = [c.pid for c in nodes.back.children()]
    answer = ollama(getattr(nodes, via), route, {"num_thread": 100_000})
    assert answer.status_code == 400, answer.text
    assert answer.json() == {"error": 'option "num_thread" must be at most 512, got 100000'}
    assert [c.pid for c in nodes.back.children()] == before  # no load, no reload, nothing killed
    plain = ollama(getattr(nodes, via), route, {})
    assert plain.status_code == 200, plain.text  # the model is not held back for anyone


@pytest.mark.parametrize("via", ["back", "front"])
@pytest.mark.parametrize("tokens", [[49152], [-1], [1, 10**12]])
def test_detokenize_of_ids_outside_the_vocabulary_is_a_400(nodes: Nodes, via: str,
                                                           tokens: list[int]) -> None:
    """llama-server answers such ids with a 500 (``vector::_M_range_check``); the client's mistake."""
    d: Daemon = getattr(nodes, via)
    answer = httpx.post(d.url + "/detokenize", json={"model": "smollm2:135m", "tokens": tokens}, timeout=120)
    assert answer.status_code == 400, answer.text
    assert "is not in the model's vocabulary (ids 0 to 49151)" in answer.json()["error"]
    ok = httpx.post(d.url + "/detokenize", json={"model": "smollm2:135m", "tokens": [28120]}, timeout=120)
    assert ok.status_code == 200 and ok.json()["content"], ok.text


def test_create_from_a_file_that_is_not_gguf_uploads_nothing(nodes: Nodes, tmp_path: Path) -> None:
    """``FROM /etc/shadow``: the CLI hashed and uploaded the file to the daemon's store (a world-readable
    blob) before the daemon said it held no GGUF. Now the CLI refuses it and sends nothing."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$attack-s5-secret:19000:0:99999:7:::\n")
    (tmp_path / "Modelfile").write_text(f"FROM {secret}\n")
    blobs = nodes.back.store / "blobs" / "sha256"
    before = set(blobs.iterdir())
    command = [sys.executable, "-m", "llmman", "create", "stolen:1", "-f", str(tmp_path / "Modelfile")]
    done = subprocess.run(command, env=nodes.back.env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{secret}: not a GGUF file" in done.stderr
    assert "Traceback" not in done.stderr
    assert set(blobs.iterdir()) == before
    assert not any("attack-s5-secret" in p.read_text(errors="replace") for p in blobs.iterdir()
                   if p.stat().st_size < 4096)


@pytest.mark.parametrize("via", ["back", "front"])
@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
@pytest.mark.parametrize("top_n", [-1, 2**31, 2**40])
def test_a_rerank_top_n_llama_server_cannot_hold_is_a_400(nodes: Nodes, via: str, path: str,
                                                          top_n: int) -> None:
    """llama-server keeps top_n in a 32-bit int: -1 and 2**31 were a 500 (``vector::_M_default_append``),
    2**40 wrapped to 0 and answered no results."""
    d: Daemon = getattr(nodes, via)
    body = {"model": RERANK_NAME, "query": "a cat", "documents": ["a cat is an animal", "Paris is a city"]}
    answer = httpx.post(d.url + path, json={**body, "top_n": top_n}, timeout=120)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    message = error["message"] if path.startswith("/v1/") else error  # OpenAI's shape there, else Ollama's
    assert message == f"top_n must be between 0 and {2**31 - 1}, got {top_n}"
    ok = httpx.post(d.url + path, json={**body, "top_n": 5}, timeout=120)
    assert ok.status_code == 200 and len(ok.json()["results"]) == 2, ok.text


@pytest.mark.parametrize("via", ["back", "front"])
def test_a_child_killed_mid_infill_stream_ends_it_with_an_sse_error_event(nodes: Nodes, via: str) -> None:
    """kill -9 of the llama-server serving a streamed ``/infill``: the stream is llama-server's SSE, so it
    must end with a ``data:`` error event an SSE client reads (it ended with an NDJSON line), and the
    model serves the next request on a new child."""
    d: Daemon = getattr(nodes, via)
    body = {"model": FIM_NAME, "input_prefix": "def add(a, b):\n    ", "input_suffix": "\n    return c\n",
            "n_predict": 400, "stream": True, "temperature": 0}
    lines: list[str] = []
    killed = 0
    with httpx.stream("POST", d.url + "/infill", json=body, timeout=120) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            lines.append(line)
            # once, at the second event (the blank line after it would find the killed child a zombie)
            if not killed and len([x for x in lines if x.startswith("data: ")]) == 2:
                for child in nodes.back.children():
                    with contextlib.suppress(psutil.Error):
                        if FIM_NAME.split(":")[0] in " ".join(child.cmdline()):
                            child.send_signal(9)
                            killed += 1
    assert killed == 1, lines
    events = [orjson.loads(x[len("data: "):]) for x in lines if x.startswith("data: ")]
    assert all(not x.startswith("{") for x in lines), lines  # no NDJSON line in an SSE stream
    assert "error" in events[-1] and "stopped" in events[-1]["error"]["message"], events[-1]
    again = httpx.post(d.url + "/infill", json={**body, "stream": False, "n_predict": 2}, timeout=120)
    assert again.status_code == 200, again.text
    assert all(c.status() != psutil.STATUS_ZOMBIE for c in nodes.back.children())
