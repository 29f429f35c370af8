"""The off switches and the bounded labels through a hop: two real daemons whose llama-server is the fake,
``node-a`` with metrics and the request log off, storing nothing, ``node-b`` with both on, storing
``tiny``, each the other's peer. Every dialect streams through ``node-a`` to ``node-b``; ``node-a`` counts
and logs nothing (``/metrics`` 404, no ``requests.db``) while ``node-b`` counts each as a hop. Requests for
made-up model names that reach ``node-b`` as hops add no series there."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import HOP, Daemon, free_port, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TINY = "docker.io/ai/tiny:latest"
HOSTS = {"a": "127.0.0.63", "b": "127.0.0.64"}
OFF = {"LLMMAN_METRICS": "off", "LLMMAN_LOG_REQUESTS": "off"}

#: A streamed request on each dialect the fake answers.
STREAMS: list[tuple[str, dict[str, Any]]] = [
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
    ("/api/generate", {"prompt": "hi", "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
    ("/v1/completions", {"prompt": "hi", "stream": True}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}),
    ("/v1/responses", {"input": "hi", "stream": True}),
]


def _daemon(tmp: Path, name: str, peer: str, port: int, stores: bool, env: dict[str, str]) -> Daemon:
    make_store(tmp, ("tiny",) if stores else ())
    (tmp / "bin").mkdir()
    return start_daemon(tmp, host=HOSTS[name], port=port, extra_env={
        "LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_NODE_NAME": f"node-{name}",
        "LLMMAN_PEERS": peer, "LLMMAN_MEMORY": "4GB", "LLMMAN_SPREAD": "off", **env})


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Daemon, Path]]:
    ports = {n: free_port(h) for n, h in HOSTS.items()}
    b = _daemon(tmp_path_factory.mktemp("b"), "b", f"{HOSTS['a']}:{ports['a']}", ports["b"], True, {})
    root_a = tmp_path_factory.mktemp("a")
    try:
        a = _daemon(root_a, "a", f"{HOSTS['b']}:{ports['b']}", ports["a"], False, OFF)
    except BaseException:
        b.stop(signal.SIGKILL)
        raise
    yield a, b, root_a
    for d in (a, b):
        d.stop(signal.SIGTERM)


def samples(d: Daemon) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(d.url + "/metrics", timeout=10).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_node_with_both_off_forwards_every_dialect_and_counts_nothing(
        pair: tuple[Daemon, Daemon, Path]) -> None:
    a, b, root_a = pair
    for path, body in STREAMS:
        r = httpx.post(a.url + path, json={"model": "tiny", **body}, timeout=60)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["x-llmman-node"] == "node-b", path  # served on the peer
        assert "Hello" in r.text, path
    r = httpx.get(a.url + "/metrics", timeout=10)
    assert r.status_code == 404 and list(r.json()) == ["error"]
    assert httpx.get(a.url + "/llmman/requests", timeout=10).json() == {"requests": []}
    assert not list(root_a.rglob("requests.db"))
    got = samples(b)
    for path, _ in STREAMS:
        key = [k for k in got if k[0] == "llmman_requests_total" and dict(k[1])["route"] == path
               and dict(k[1])["kind"] == "hop" and dict(k[1])["model"] == TINY]
        assert len(key) == 1 and got[key[0]] == 1, path
    assert sum(v for (name, labels), v in got.items()
               if name == "llmman_hops_total" and ("outcome", "ok") in labels) == len(STREAMS)


def test_made_up_names_as_hops_add_no_series(pair: tuple[Daemon, Daemon, Path]) -> None:
    _, b, _ = pair
    for i in range(50):
        path, body = STREAMS[i % len(STREAMS)]
        r = httpx.post(b.url + path, json={"model": f"made-up-{i}", **body}, headers=HOP, timeout=30)
        assert r.status_code == 404, (path, r.text)
    got = samples(b)
    lost = {(dict(k[1])["route"], dict(k[1])["model"]) for k in got
            if k[0] == "llmman_requests_total" and dict(k[1])["status"] == "404"}
    assert lost == {(path, "(unknown)") for path, _ in STREAMS}
    assert not [k for k in got if "made-up" in str(k[1])]
