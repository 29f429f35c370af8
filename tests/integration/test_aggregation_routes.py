"""The same answer whatever the route (issue 10), through real daemons with the real SmolLM2 model.

* Copy on every route: ``b`` (127.0.0.22) stores ``smollm2:135m`` but its memory cap (64 MB) is below
  the model's 98 MB of weights; ``a`` (127.0.0.21, 4 GB) stores nothing; each names the other. A request
  to ``a`` on any inference route, in any dialect, must make ``a`` copy the model from ``b`` (both run
  offline: ``b`` is the only place to get it) and answer it there. A fresh pair per route, so each
  starts cold.
* Unload in every spelling: a zero ``keep_alive`` (``0``, ``"0"``, ``"0s"``, ``"0m"``, ``"0h"``,
  ``"0ms"``, ``0.0``) on ``/api/generate`` without a prompt or ``/api/chat`` without messages is an
  unload: on one daemon (``solo``) it answers 200 ``done_reason: "unload"`` whether the model was loaded
  or only stored, and the model leaves ``/api/ps``. Through a peer (a second pair, 127.0.0.23 and .24,
  both with room: ``a`` stores nothing, ``b`` stores the model): sent to ``a`` while ``b`` has the model
  loaded, it is forwarded to ``b``, which unloads it; with the model loaded nowhere, every spelling gets
  the same answer. ``a`` never copies or loads the model for an unload.
"""

from __future__ import annotations

import concurrent.futures
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from tests.integration.daemons import HOP, Daemon, free_port, local_ps, local_tags, start_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(120)]

SMOL = "smollm2:135m"
SMOL_REF = f"docker.io/ai/{SMOL}"
BASE = {"LLMMAN_CONTEXT_LENGTH": "512", "LLMMAN_NUM_PARALLEL": "1", "LLMMAN_DEBUG": "1"}
ROOM, NO_ROOM = "4GB", "64MB"  # SmolLM2-135M Q4_1: 98 MB of weights
EMBEDDING_LENGTH = 576  # SmolLM2-135M's
PROMPT = "Say hi"
ZEROS: list[object] = [0, "0", "0s", "0m", "0h", "0ms", 0.0]


@dataclass
class Pair:
    a: Daemon
    b: Daemon


def start_pair(tmp: Path, model_file: Path, hosts: tuple[str, str],
               memory: tuple[str, str]) -> Pair:
    """``a`` on ``hosts[0]`` storing nothing, ``b`` on ``hosts[1]`` storing SmolLM2, naming each other;
    started side by side. ``memory`` is each one's ``LLMMAN_MEMORY``."""
    (tmp / "a").mkdir()
    Store(tmp / "b" / "store").build(parse_reference(SMOL), model_file)
    ports = free_port(hosts[0]), free_port(hosts[1])
    peers = f"{hosts[1]}:{ports[1]}", f"{hosts[0]}:{ports[0]}"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(start_daemon, tmp / name, host=host, port=port,
                               extra_env=BASE | {"LLMMAN_MEMORY": mem, "LLMMAN_PEERS": peer})
                   for name, host, port, mem, peer in zip("ab", hosts, ports, memory, peers, strict=True)]
    started = [f.result() for f in futures if f.exception() is None]
    if len(started) < 2:
        stop(started)
        raise next(e for f in futures if (e := f.exception()) is not None)  # its message holds the log
    return Pair(*started)


def stop(daemons: list[Daemon]) -> None:
    for d in daemons:
        if d.process.poll() is None:
            d.stop(signal.SIGTERM)


def post(d: Daemon, path: str, body: dict[str, object],
         headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(d.url + path, json=body, headers=headers, timeout=120)


# --- a. a cold node copies the model from the peer that stores it, on every route ---

def _chat(body: dict[str, Any]) -> None:
    assert body["done"] is True and body["message"]["role"] == "assistant", body
    assert str(body["message"]["content"]).strip(), body


def _messages(body: dict[str, Any]) -> None:
    assert body["type"] == "message" and body["role"] == "assistant", body
    texts = [str(block["text"]) for block in body["content"] if block["type"] == "text"]
    assert texts and "".join(texts).strip(), body
    assert body["stop_reason"] in {"end_turn", "max_tokens"}, body


def _responses(body: dict[str, Any]) -> None:
    assert body["object"] == "response" and body["status"] in {"completed", "incomplete"}, body
    texts = [str(part["text"]) for item in body["output"] if item["type"] == "message"
             for part in item["content"] if part["type"] == "output_text"]
    assert texts and "".join(texts).strip(), body


def _vector(vector: object) -> None:
    assert isinstance(vector, list) and len(vector) == EMBEDDING_LENGTH, vector
    assert all(isinstance(v, float) for v in vector) and any(v != 0.0 for v in vector), vector


def _embed(body: dict[str, Any]) -> None:
    assert len(body["embeddings"]) == 1, body
    _vector(body["embeddings"][0])


def _embeddings(body: dict[str, Any]) -> None:
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0], body
    assert body["data"][0]["object"] == "embedding"
    _vector(body["data"][0]["embedding"])


ROUTES: dict[str, tuple[dict[str, object], Callable[[dict[str, Any]], None]]] = {
    "/api/chat": ({"model": SMOL, "stream": False, "messages": [{"role": "user", "content": PROMPT}],
                   "options": {"num_predict": 16, "temperature": 0}}, _chat),
    "/v1/messages": ({"model": SMOL, "max_tokens": 16, "temperature": 0,
                      "messages": [{"role": "user", "content": PROMPT}]}, _messages),
    "/v1/responses": ({"model": SMOL, "max_output_tokens": 16, "temperature": 0, "input": PROMPT},
                      _responses),
    "/api/embed": ({"model": SMOL, "input": "hello world"}, _embed),
    "/v1/embeddings": ({"model": SMOL, "input": "hello world"}, _embeddings),
}


@pytest.fixture
def cold(tmp_path: Path, model_file: Path) -> Iterator[Pair]:
    """A fresh pair: ``a`` has room and stores nothing, ``b`` stores the model but has no room for it."""
    pair = start_pair(tmp_path, model_file, ("127.0.0.21", "127.0.0.22"), (ROOM, NO_ROOM))
    yield pair
    stop([pair.a, pair.b])


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_cold_node_copies_the_model_from_its_peer_on_every_route(cold: Pair, path: str) -> None:
    body, check = ROUTES[path]
    assert local_tags(cold.a) == {} and SMOL_REF in local_tags(cold.b)
    r = post(cold.a, path, body)
    assert r.status_code == 200, f"{path}: {r.status_code} {r.text}"
    check(r.json())
    assert local_tags(cold.a) == {SMOL_REF: local_tags(cold.b)[SMOL_REF]}  # copied, the same manifest
    assert local_ps(cold.a) == [SMOL_REF] and cold.a.children(), "served on a"
    assert local_ps(cold.b) == [] and cold.b.children() == [], "b has no room: it must not load it"


# --- b. a zero keep_alive unloads in every spelling, locally and through a peer ---

def unload_body(path: str, keep_alive: object) -> dict[str, object]:
    """An Ollama unload: nothing to generate (no prompt, or no messages) and ``keep_alive``."""
    body: dict[str, object] = {"model": SMOL, "keep_alive": keep_alive}
    if path == "/api/chat":
        body["messages"] = []
    return body


def load(d: Daemon) -> None:
    """Load SmolLM2 on ``d`` itself (an empty generate, hopped so it stays there)."""
    r = post(d, "/api/generate", {"model": SMOL}, HOP)
    assert r.status_code == 200 and r.json()["done_reason"] == "load", r.text
    wait_until(lambda: SMOL_REF in local_ps(d), f"{SMOL} loaded on {d.url}")


def assert_unloaded(r: httpx.Response, path: str, keep_alive: object) -> None:
    assert r.status_code == 200, f"{path} keep_alive={keep_alive!r}: {r.status_code} {r.text}"
    body = r.json()
    assert body["done"] is True and body["done_reason"] == "unload", body
    assert ("message" in body) == (path == "/api/chat"), body


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> Iterator[Daemon]:
    """One daemon, no peers, SmolLM2 in its store."""
    tmp = tmp_path_factory.mktemp("solo")
    Store(tmp / "store").build(parse_reference(SMOL), model_file)
    d = start_daemon(tmp, extra_env=BASE)
    yield d
    stop([d])


@pytest.mark.parametrize("keep_alive", ZEROS, ids=repr)
@pytest.mark.parametrize("path", ["/api/generate", "/api/chat"])
def test_every_zero_keep_alive_unloads_locally(solo: Daemon, path: str, keep_alive: object) -> None:
    load(solo)
    assert_unloaded(post(solo, path, unload_body(path, keep_alive)), path, keep_alive)
    wait_until(lambda: local_ps(solo) == [] and solo.children() == [], f"{SMOL} unloaded")
    # Stored but not loaded: the same answer, and still nothing loaded.
    assert_unloaded(post(solo, path, unload_body(path, keep_alive)), path, keep_alive)
    assert local_ps(solo) == [] and solo.children() == []


@pytest.fixture(scope="module")
def peered(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> Iterator[Pair]:
    """``a`` stores nothing, ``b`` stores SmolLM2; both have room; each names the other."""
    pair = start_pair(tmp_path_factory.mktemp("peered"), model_file, ("127.0.0.23", "127.0.0.24"),
                      (ROOM, ROOM))
    yield pair
    stop([pair.a, pair.b])


@pytest.fixture
def idle(peered: Pair) -> Iterator[Pair]:
    """The pair with nothing loaded; afterwards ``a`` is put back to storing and loading nothing, so one
    spelling that went wrong cannot change the next one's case."""
    yield peered
    if local_tags(peered.a):
        assert httpx.request("DELETE", peered.a.url + "/api/delete", json={"model": SMOL}, headers=HOP,
                             timeout=60).status_code == 200
    for d in (peered.a, peered.b):
        if local_ps(d):
            assert post(d, "/api/generate", {"model": SMOL, "keep_alive": 0}, HOP).status_code == 200
    wait_until(lambda: local_ps(peered.a) == [] == local_ps(peered.b), "both nodes unloaded")


@pytest.fixture
def loaded_on_b(idle: Pair) -> Pair:
    """SmolLM2 loaded on ``b`` (and nowhere else)."""
    load(idle.b)
    return idle


@pytest.mark.parametrize("keep_alive", ZEROS, ids=repr)
@pytest.mark.parametrize("path", ["/api/generate", "/api/chat"])
def test_every_zero_keep_alive_unloads_through_a_peer(loaded_on_b: Pair, path: str,
                                                      keep_alive: object) -> None:
    a, b = loaded_on_b.a, loaded_on_b.b
    assert_unloaded(post(a, path, unload_body(path, keep_alive)), path, keep_alive)
    wait_until(lambda: local_ps(b) == [], f"{SMOL} unloaded on b")
    assert local_tags(a) == {} and local_ps(a) == [] and a.children() == [], "a must forward, never copy"


@pytest.mark.parametrize("path", ["/api/generate", "/api/chat"])
def test_every_zero_keep_alive_answers_alike_when_the_peer_only_stores_it(idle: Pair, path: str) -> None:
    """Loaded nowhere, stored on ``b`` only: the pool answers as one daemon storing it would — 200
    ``unload`` for every spelling (the unload goes to the node storing it) — and neither node loads or
    copies the model for it."""
    answers: dict[str, tuple[int, object]] = {}
    for keep_alive in ZEROS:
        r = post(idle.a, path, unload_body(path, keep_alive))
        key = "done_reason" if r.status_code == 200 else "error"
        answers[repr(keep_alive)] = (r.status_code, r.json().get(key))
    shown = "; ".join(f"keep_alive={k}: {v}" for k, v in answers.items())
    assert len(set(answers.values())) == 1, shown
    assert next(iter(answers.values())) == (200, "unload"), shown
    assert local_tags(idle.a) == {} and local_ps(idle.a) == [] == local_ps(idle.b), "nothing copied or loaded"
