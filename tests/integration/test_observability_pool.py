"""The request log and the metrics count exactly the requests sent, on every dialect, locally and through a
hop: two real daemons (``node-a`` storing nothing, ``node-b`` storing ``tiny``, each the other's peer),
their llama-server the fake. A request sent to node-a is logged there as ``forwarded`` to node-b and on
node-b as ``hop``; one sent to node-b directly as ``local``. The tokens of each row are the answer's own
usage as the client read it."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import Daemon, free_port, start_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TINY = "docker.io/ai/tiny:latest"
HOSTS = {"a": "127.0.0.61", "b": "127.0.0.62"}


def _daemon(tmp: Path, name: str, peer: str, port: int, stores: bool) -> Daemon:
    make_store(tmp, ("tiny",) if stores else ())
    (tmp / "bin").mkdir()
    host = HOSTS[name]
    return start_daemon(tmp, host=host, port=port, extra_env={
        "LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_NODE_NAME": f"node-{name}",
        "LLMMAN_PEERS": peer, "LLMMAN_MEMORY": "4GB", "LLMMAN_SPREAD": "off"})


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Daemon]]:
    ports = {n: free_port(h) for n, h in HOSTS.items()}
    b = _daemon(tmp_path_factory.mktemp("b"), "b", f"{HOSTS['a']}:{ports['a']}", ports["b"], True)
    try:
        a = _daemon(tmp_path_factory.mktemp("a"), "a", f"{HOSTS['b']}:{ports['b']}", ports["a"], False)
    except BaseException:
        b.stop(signal.SIGKILL)
        raise
    yield a, b
    for d in (a, b):
        d.stop(signal.SIGTERM)


#: (path, body): every dialect the fake answers, streamed and not, each with usage in its answer.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "stream": False}),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi there"}], "stream": True}),
    ("/api/generate", {"prompt": "hello", "stream": False}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi you"}], "stream": True,
                              "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "once upon"}),
]


def usage(path: str, text: str) -> tuple[int, int]:
    """The (prompt, completion) tokens the answer reports, as a client reads them."""
    docs = [json.loads(line.removeprefix("data: ")) for line in text.splitlines()
            if line.strip() and line.strip() != "data: [DONE]"]
    last = [d for d in docs if d.get("usage") or d.get("done")][-1]
    if path.startswith("/api/"):
        return last["prompt_eval_count"], last["eval_count"]
    return last["usage"]["prompt_tokens"], last["usage"]["completion_tokens"]


def rows(d: Daemon, count: int) -> list[dict[str, Any]]:
    """``d``'s request-log rows once it has written ``count`` of them (the writer batches off the loop)."""
    found: list[dict[str, Any]] = []

    def written() -> bool:
        found[:] = httpx.get(d.url + "/llmman/requests", params={"limit": 100}, timeout=10).json()["requests"]
        return len(found) >= count

    wait_until(written, f"{count} request-log rows on {d.url}")
    return found


def counters(d: Daemon) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(d.url + "/metrics", timeout=10).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_request_is_logged_and_counted_once_where_it_ran(pair: tuple[Daemon, Daemon]) -> None:
    a, b = pair
    sent: list[tuple[str, str, tuple[int, int]]] = []  # (front node, path, usage)
    for front in (a, b):
        for path, body in CASES:
            r = httpx.post(front.url + path, json={"model": "tiny", **body}, timeout=60)
            assert r.status_code == 200, r.text
            assert r.headers["x-llmman-node"] == "node-b"
            sent.append(("a" if front is a else "b", path, usage(path, r.text)))
    n = len(CASES)

    a_rows, b_rows = rows(a, n), rows(b, 2 * n)
    assert len(a_rows) == n and len(b_rows) == 2 * n
    assert {(r["kind"], r["node"], r["model"], r["status"]) for r in a_rows} == {
        ("forwarded", "node-b", TINY, 200)}
    assert sorted(r["kind"] for r in b_rows) == ["hop"] * n + ["local"] * n
    assert {(r["node"], r["model"], r["status"]) for r in b_rows} == {("node-b", TINY, 200)}
    # Each row's tokens are its answer's usage (rows come newest first).
    for row, (_, path, (prompt, completion)) in zip(reversed(a_rows), sent[:n], strict=True):
        assert (row["route"], row["prompt_tokens"], row["completion_tokens"]) == (path, prompt, completion)
    local = [r for r in reversed(b_rows) if r["kind"] == "local"]
    for row, (_, path, (prompt, completion)), (_, body) in zip(local, sent[n:], CASES, strict=True):
        assert (row["route"], row["prompt_tokens"], row["completion_tokens"]) == (path, prompt, completion)
        if body.get("stream", path.startswith("/api/")):  # Ollama streams unless told not to
            assert row["ttft"] is not None and row["ttft"] <= row["duration"]
        else:  # a whole answer has no first token of its own: no TTFT, and no speed made up from it
            assert row["ttft"] is None

    got_a, got_b = counters(a), counters(b)
    total = {kind: sum(v for (name, labels), v in got.items() if name == "llmman_requests_total"
                       and ("kind", kind) in labels)
             for got, kind in ((got_a, "forwarded"), (got_b, "hop"), (got_b, "local"))}
    assert total == {"forwarded": n, "hop": n, "local": n}
    peer_b = f"{HOSTS['b']}:{b.url.rsplit(':', 1)[1]}"
    assert got_a["llmman_forwards_total", frozenset({("peer", peer_b), ("outcome", "ok")})] == n
    assert sum(v for (name, _), v in got_b.items() if name == "llmman_hops_total") == n
    out_b = sum(v for (name, labels), v in got_b.items()
                if name == "llmman_tokens_total" and ("direction", "out") in labels)
    assert out_b == sum(c for _, _, (_, c) in sent) * 1  # hop + local rows: every answer generated on b once
    assert got_b["llmman_queue_wait_seconds_count", frozenset({("model", TINY)})] == 2 * n
