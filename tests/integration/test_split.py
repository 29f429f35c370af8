"""One model across three real daemons (docs/split.md, "How a split is planned"), with the real Gemma 3 270M.

``alpha`` (127.0.0.2), ``bravo`` (127.0.0.3) and ``charlie`` (127.0.0.4) name each other; each has 260 MB
for models, less than Gemma's estimate at a 1024-token context (291 MB) but, together, enough; ``bravo``
and ``charlie`` lend RPC workers (``rpc.serve``, a 6 s lease). Every node stores Gemma and SmolLM2 (which
fits one node). The first Gemma request goes to ``alpha``, which runs llama-server with workers on the
other two; every other node's requests reach it through a hop. ``gemma3:wide`` is Gemma again under a
preset of 8 slots of its whole trained context (32768 tokens): its KV cache alone is more than the three
budgets together.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from tests.integration.conftest import MODEL_NAME, MODEL_REF
from tests.integration.daemons import Daemon, free_port, start_daemon, wait_until
from tests.integration.test_rpc_workers import rpc_children

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(300)]

GEMMA, GEMMA_REF = "gemma3:270m", "docker.io/ai/gemma3:270m"
WIDE = "gemma3:wide"
PRESETS = f'[models."{WIDE}"]\ncontext = 32768\nparallel = 8\n'
HOP = {"x-llmman-hop": "1"}
BASE = {"LLMMAN_CONTEXT_LENGTH": "1024", "LLMMAN_MEMORY": "260MB", "LLMMAN_RESTART_BACKOFF": "0.2"}
LENDER = {"LLMMAN_RPC_SERVE": "1", "LLMMAN_RPC_LEASE": "6s"}


@dataclass
class Pool:
    alpha: Daemon
    bravo: Daemon
    charlie: Daemon

    @property
    def all(self) -> tuple[Daemon, Daemon, Daemon]:
        return self.alpha, self.bravo, self.charlie

    def rpc_workers(self) -> int:
        return sum(len(rpc_children(d)) for d in self.all)


@pytest.fixture(scope="module")
def gemma(model_file: Path) -> Path:
    path = model_file.parent / "gemma-3-270m-q4_k_m.gguf"
    if not path.is_file():
        pytest.skip("Gemma 3 270M missing: run scripts/setup.sh --test")
    return path


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, model_file: Path, gemma: Path) -> Iterator[Pool]:
    hosts = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    ports = [free_port(h) for h in hosts]
    started: list[Daemon] = []
    try:
        for i, host in enumerate(hosts):
            tmp = tmp_path_factory.mktemp(f"split{i}")
            store = Store(tmp / "store")
            store.build(parse_reference(GEMMA), gemma)
            store.build(parse_reference(MODEL_NAME), model_file)
            store.build(parse_reference(WIDE), gemma)
            config = tmp / "home" / ".config" / "llmman" / "llmman.conf"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(PRESETS, encoding="utf-8")
            peers = ",".join(f"{h}:{p}" for j, (h, p) in enumerate(zip(hosts, ports, strict=True)) if j != i)
            env = BASE | {"LLMMAN_PEERS": peers, "LLMMAN_NODE_NAME": ("alpha", "bravo", "charlie")[i]}
            started.append(start_daemon(tmp, host=host, port=ports[i], extra_env=env | (LENDER if i else {})))
        yield Pool(*started)
    finally:
        for d in started:
            d.stop(signal.SIGTERM)


def ps(d: Daemon) -> list[dict[str, Any]]:
    r = httpx.get(d.url + "/api/ps", timeout=30)
    r.raise_for_status()
    models: list[dict[str, Any]] = r.json()["models"]
    return models


def node(d: Daemon) -> dict[str, Any]:
    r = httpx.get(d.url + "/llmman/node", timeout=10)
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    return doc


def worker_ids(d: Daemon) -> set[str]:
    """The ids of the workers ``d`` lends now."""
    r = httpx.get(d.url + "/llmman/rpc/workers", timeout=10)
    r.raise_for_status()
    return {str(w["id"]) for w in r.json()["workers"]}


def unload(d: Daemon, model: str) -> None:
    r = httpx.post(d.url + "/api/generate", json={"model": model, "keep_alive": 0}, timeout=120)
    assert r.status_code == 200, r.text


def ask(d: Daemon, path: str, model: str = GEMMA) -> str:
    """One short answer from ``path`` (non-streamed), its text."""
    say = [{"role": "user", "content": "Say hello"}]
    bodies: dict[str, dict[str, Any]] = {
        "/api/chat": {"messages": say, "stream": False, "options": {"num_predict": 8}},
        "/api/generate": {"prompt": "Say hello", "stream": False, "options": {"num_predict": 8}},
        "/v1/chat/completions": {"messages": say, "max_tokens": 8},
        "/v1/completions": {"prompt": "Say hello", "max_tokens": 8},
        "/v1/messages": {"messages": say, "max_tokens": 8},
        "/v1/responses": {"input": "Say hello", "max_output_tokens": 16},
    }
    r = httpx.post(d.url + path, json={"model": model, **bodies[path]}, timeout=180)
    assert r.status_code == 200, f"{path} on {d.url}: {r.status_code} {r.text}"
    doc = r.json()
    text = {"/api/chat": lambda: doc["message"]["content"], "/api/generate": lambda: doc["response"],
            "/v1/chat/completions": lambda: doc["choices"][0]["message"]["content"],
            "/v1/completions": lambda: doc["choices"][0]["text"],
            "/v1/messages": lambda: doc["content"][0]["text"],
            "/v1/responses": lambda: doc["output"][-1]["content"][0]["text"]}[path]()
    assert isinstance(text, str)
    return text


def split_entry(d: Daemon) -> dict[str, Any]:
    """The pooled ``/api/ps`` entry of Gemma, asserted to be listed once."""
    entries = [m for m in ps(d) if m["name"] == GEMMA_REF]
    assert len(entries) == 1, entries
    return entries[0]


def test_a_model_that_fits_one_node_is_not_split(pool: Pool) -> None:
    ask(pool.alpha, "/api/chat", MODEL_NAME)
    entry = next(m for m in ps(pool.alpha) if m["name"] == MODEL_REF)
    assert "split" not in entry
    assert pool.rpc_workers() == 0
    unload(pool.alpha, MODEL_NAME)


def test_a_pool_too_small_is_507_in_the_clients_dialect(pool: Pool) -> None:
    say = [{"role": "user", "content": "Say hello"}]
    # the wide preset (8 slots of 32768 tokens): 1.2 GB, more than the three 260 MB budgets together
    r = httpx.post(pool.alpha.url + "/api/chat", json={"model": WIDE, "messages": say, "stream": False},
                   timeout=60)
    assert r.status_code == 507, r.text
    # the pool as a whole lacks the memory: the 507 is answered where it was planned, not moved on to the
    # peers (which, lacking the model, would copy it only to refuse it too)
    assert r.headers["x-llmman-node"] == "alpha"
    message = r.json()["error"]
    assert "more than any node has" in message and "lacks" in message, message
    # through a hop (bravo forwards to, or is forwarded from, the others): OpenAI's shape
    r = httpx.post(pool.bravo.url + "/v1/chat/completions", json={"model": WIDE, "messages": say}, timeout=60)
    assert r.status_code == 507, r.text
    error = r.json()["error"]
    assert error["code"] == "insufficient_memory" and "lacks" in error["message"], error
    # a request's own options too: Gemma at its whole context with 8192-token batches (880 MB), whose
    # buffers alone are more than the node running llama-server has
    big = {"num_ctx": 32768, "num_batch": 8192, "num_predict": 4}
    r = httpx.post(pool.charlie.url + "/api/chat", json={"model": GEMMA, "messages": say, "stream": False,
                                                          "options": big}, timeout=60)
    # this node's own shortfall (a node with more room might hold the head): 500, tried on every node
    assert r.status_code == 500, r.text
    assert "keeps the embeddings and buffers" in r.json()["error"] and "lacks" in r.json()["error"]
    for d in pool.all:  # nothing leased, nothing loaded
        assert not worker_ids(d)
        assert not [m for m in ps(d) if m["name"] == GEMMA_REF]
    assert pool.rpc_workers() == 0
    assert ask(pool.alpha, "/api/chat")  # the next request that fits the pool is split as usual
    assert len(split_entry(pool.alpha)["split"]) == 3


def test_split_answers_every_dialect_on_every_node(pool: Pool) -> None:
    assert ask(pool.alpha, "/api/chat")
    assert pool.rpc_workers() == 2
    entry = split_entry(pool.alpha)
    names = [part["node"] for part in entry["split"]]
    assert names[0] == "alpha" and set(names[1:]) == {"bravo", "charlie"}  # node names, as llmman nodes
    assert all(part["size"] > 0 for part in entry["split"])
    assert entry["size"] == sum(part["size"] for part in entry["split"])
    # this node's loaded holds its own share only; the lenders count their workers as reserved
    assert node(pool.alpha)["loaded"][GEMMA_REF] == entry["split"][0]["size"] < 260_000_000
    for lender in (pool.bravo, pool.charlie):
        doc = node(lender)
        assert GEMMA_REF not in doc["loaded"] and doc["rpc"]["reserved"] > 0 and doc["rpc"]["workers"] == 1
    # a request to any node answers, through a hop to alpha: each dialect once
    for d, path in ((pool.bravo, "/v1/chat/completions"), (pool.charlie, "/api/generate"),
                    (pool.bravo, "/v1/messages"), (pool.charlie, "/v1/completions"),
                    (pool.alpha, "/v1/responses"), (pool.charlie, "/api/chat")):
        assert ask(d, path)
    for d in pool.all:  # the pooled list shows the split model once, wherever it is asked
        assert split_entry(d)["split"] == entry["split"]
    assert pool.rpc_workers() == 2  # no second split was planned


def test_a_killed_worker_cuts_the_stream_and_the_next_request_plans_again(pool: Pool) -> None:
    before = worker_ids(pool.bravo)
    assert before
    body = {"model": GEMMA, "prompt": "Count from 1 to 1000: 1, 2, 3,", "raw": True,
            "options": {"num_predict": 3000, "temperature": 0}}
    lines: list[dict[str, Any]] = []
    with httpx.stream("POST", pool.alpha.url + "/api/generate", json=body, timeout=180) as r:
        assert r.status_code == 200
        for raw in r.iter_lines():
            if not raw:
                continue
            lines.append(json.loads(raw))
            if len(lines) == 3:  # tokens are flowing: kill the worker under them
                [worker] = rpc_children(pool.bravo)
                worker.kill()
    assert len(lines) > 3
    assert "error" in lines[-1] and not lines[-1].get("done"), lines[-1]
    wait_until(lambda: not [m for m in ps(pool.alpha) if m["name"] == GEMMA_REF], "the split to end")
    # the next request is served by a new plan: new workers, none of the old ones
    assert ask(pool.alpha, "/api/chat")
    after = worker_ids(pool.bravo)
    assert after and not after & before
    assert len(split_entry(pool.alpha)["split"]) == 3
    wait_until(lambda: pool.rpc_workers() == 2, "the old worker on charlie to be released")


def idle(d: Daemon, reference: str) -> bool:
    """True when ``d`` runs ``reference`` with no request on it (its ``/llmman/node``)."""
    load = node(d)["models"].get(reference)
    return load is not None and load["in_flight"] == 0 and load["queued"] == 0


def test_a_larger_context_plans_the_split_again(pool: Pool) -> None:
    if not [m for m in ps(pool.alpha) if m["name"] == GEMMA_REF]:
        ask(pool.alpha, "/api/chat")
    assert split_entry(pool.alpha)["context_length"] == 1024
    before = worker_ids(pool.bravo) | worker_ids(pool.charlie)
    assert len(before) == 2
    wait_until(lambda: idle(pool.alpha, GEMMA_REF), "the split to be idle")
    say = [{"role": "user", "content": "Say hello"}]
    r = httpx.post(pool.alpha.url + "/api/chat", json={"model": GEMMA, "messages": say, "stream": False,
                                                        "options": {"num_ctx": 2048, "num_predict": 4}},
                   timeout=180)
    assert r.status_code == 200, r.text
    entry = split_entry(pool.alpha)
    assert entry["context_length"] == 2048 and len(entry["split"]) == 3
    after = worker_ids(pool.bravo) | worker_ids(pool.charlie)
    assert len(after) == 2 and not after & before  # new workers; the old ones were released
    assert pool.rpc_workers() == 2
    assert ask(pool.alpha, "/api/chat")  # a smaller context is served by the loaded split
    assert worker_ids(pool.bravo) | worker_ids(pool.charlie) == after


def test_unload_stops_every_worker(pool: Pool) -> None:
    if not [m for m in ps(pool.alpha) if m["name"] == GEMMA_REF]:
        ask(pool.alpha, "/api/chat")
    assert pool.rpc_workers() == 2
    unload(pool.charlie, GEMMA)  # an unload asked anywhere reaches the node that runs the split
    wait_until(lambda: pool.rpc_workers() == 0, "every ggml-rpc-server to stop")
    assert not [m for m in ps(pool.alpha) if m["name"] == GEMMA_REF]
    for lender in (pool.bravo, pool.charlie):
        wait_until(lambda d=lender: node(d)["rpc"]["reserved"] == 0, "the reservations to be freed")


def test_the_daemon_exit_releases_its_workers(pool: Pool) -> None:
    assert ask(pool.alpha, "/v1/chat/completions")
    assert pool.rpc_workers() == 2
    assert pool.alpha.stop(signal.SIGTERM) == 0  # its children stop, and it deletes its workers on the way
    wait_until(lambda: pool.rpc_workers() == 0, "the lenders to stop alpha's workers", timeout=30)
    for lender in (pool.bravo, pool.charlie):
        assert not worker_ids(lender)
