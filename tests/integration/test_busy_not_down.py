"""Busy is not down (issue 17, target 3): a peer that stops answering in time is slow, not dead, so a
request for a model only it holds is never a 404 and never a pull, but a 503 with ``Retry-After``.

``front`` (127.0.0.61) stores nothing and names ``back``; ``back`` (127.0.0.62, the fake llama-server
as its child, named as the fake) stores ``slow``. The model's name carries the address of ``registry``,
a recording HTTP server on 127.0.0.63 that answers 404 to everything: any pull of the model by ``front``
would reach it and be recorded (the daemons are offline, which still lets a pull reach this machine).
``back`` is SIGSTOPped for longer than the probe timeout (3 s) and then SIGCONTed: its kernel still
accepts connections, so ``front``'s forward sees silence, its silence check's probe times out, and
``back`` is taken for unresponsive, not dead. ``front``'s background refresh is long (60 s), so the
first request after the stop finds ``back`` up and meets the silence itself.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.integration.daemons import HOP, Daemon, free_port, wait_until
from tests.integration.test_aggregation_failover import fake_daemon
from tests.integration.test_overload_fake import error_message

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NODE = "x-llmman-node"
ROUTES = ["/api/chat", "/api/generate", "/api/show", "/v1/chat/completions", "/v1/completions",
          "/v1/messages", "/v1/responses"]


class Registry:
    """A "registry" that records every request and answers 404: where a pull would go."""

    def __init__(self, host: str) -> None:
        seen = self.seen = []  # type: list[str]

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                seen.append(f"{self.command} {self.path}")
                body = b'{"errors": [{"code": "NAME_UNKNOWN", "message": "no such repository"}]}'
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_HEAD = do_POST = _answer

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.netloc = f"{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Pool:
    front: Daemon
    back: Daemon
    registry: Registry
    model: str  # the name of the model only ``back`` stores (its registry is ``registry``)

    @property
    def back_name(self) -> str:
        return self.back.url.removeprefix("http://")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    hosts = "127.0.0.61", "127.0.0.62"
    ports = free_port(hosts[0]), free_port(hosts[1])
    registry = Registry("127.0.0.63")
    model = f"{registry.netloc}/ai/slow:latest"
    started: list[Daemon] = []
    try:
        back = fake_daemon(tmp_path_factory.mktemp("back"), hosts[1], ports[1], "node-back", (model,), {
            "LLMMAN_PEERS": f"{hosts[0]}:{ports[0]}"})
        started.append(back)
        front = fake_daemon(tmp_path_factory.mktemp("front"), hosts[0], ports[0], "node-front", (), {
            "LLMMAN_PEERS": f"{hosts[1]}:{ports[1]}", "LLMMAN_PEER_REFRESH": "60s",
            "LLMMAN_STALL_TIMEOUT": "1s", "LLMMAN_INSECURE_REGISTRIES": registry.netloc})
        started.append(front)
        yield Pool(front, back, registry, model)
    finally:
        for d in started:
            os.kill(d.process.pid, signal.SIGCONT)
            for child in d.children():
                child.kill()
            d.stop(signal.SIGKILL if d.process.poll() is None else signal.SIGTERM)
        registry.close()


def body(path: str, model: str) -> dict[str, Any]:
    """A small request for ``model`` in ``path``'s dialect (not streamed: the answer is one body)."""
    if path in ("/api/generate", "/v1/completions"):
        return {"model": model, "prompt": "hi", "stream": False}
    if path == "/api/show":
        return {"model": model}
    if path == "/v1/responses":
        return {"model": model, "input": "hi"}
    out: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    if path == "/v1/messages":
        out["max_tokens"] = 16
    return out


def post(d: Daemon, path: str, model: str) -> httpx.Response:
    return httpx.post(d.url + path, json=body(path, model), timeout=60)


def test_a_slow_peer_is_answered_503_with_retry_after_never_404_nor_a_pull(pool: Pool) -> None:
    front, back = pool.front, pool.back
    up = post(front, "/api/chat", pool.model)
    assert (up.status_code, up.headers.get(NODE)) == (200, "node-back"), up.text  # served there

    os.kill(back.process.pid, signal.SIGSTOP)
    try:
        # The first request meets the silence itself: forwarded, silent 1 s, its probe times out (3 s).
        first = post(front, "/api/chat", pool.model)
        assert first.status_code == 503, first.text
        assert int(first.headers["Retry-After"]) >= 1
        assert "not answering in time" in error_message("/api/chat", first)
        assert f"peer {pool.back_name} left out" in front.log_text()
        assert "taken for busy, not dead" in front.log_text()
        # Now back is unresponsive: every dialect gets the 503 without waiting on it.
        for path in ROUTES:
            answer = post(front, path, pool.model)
            assert answer.status_code == 503, (path, answer.status_code, answer.text)
            assert int(answer.headers["Retry-After"]) >= 1, path
            assert answer.headers["content-type"].startswith("application/json"), path
            assert "not answering in time" in error_message(path, answer), path
        assert pool.registry.seen == []  # nothing was pulled
        assert "not found" not in front.log_text().split("taken for busy, not dead", 1)[1]
    finally:
        back_again = front.log_text().count(f"peer {pool.back_name} is back")
        os.kill(back.process.pid, signal.SIGCONT)
    wait_until(lambda: front.log_text().count(f"peer {pool.back_name} is back") > back_again,
               "front to take back back")
    for path in ROUTES:
        answer = post(front, path, pool.model)
        assert (answer.status_code, answer.headers.get(NODE)) == (200, "node-back"), (path, answer.text)
    assert pool.registry.seen == []


def test_a_model_nobody_ever_had_is_still_404_after_a_pull(pool: Pool) -> None:
    """The control: the registry does record a pull, and a model no node had stays a 404."""
    name = f"{pool.registry.netloc}/ai/never:latest"
    answer = post(pool.front, "/api/chat", name)
    assert answer.status_code == 404, answer.text
    assert any("/ai/never" in line for line in pool.registry.seen), pool.registry.seen


def test_a_dead_peer_is_not_taken_for_slow(pool: Pool, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A peer that refuses (its daemon gone) is dead as before: a model only it stored is pulled (here:
    the registry is asked, and answers 404)."""
    host = "127.0.0.64"
    port = free_port(host)
    gone = fake_daemon(tmp_path_factory.mktemp("gone"), host, port, "node-gone",
                       (f"{pool.registry.netloc}/ai/gone:latest",), {})
    name = f"{pool.registry.netloc}/ai/gone:latest"
    front = fake_daemon(tmp_path_factory.mktemp("front2"), "127.0.0.65", free_port("127.0.0.65"),
                        "node-front2", (), {"LLMMAN_PEERS": f"{host}:{port}", "LLMMAN_PEER_REFRESH": "60s",
                                            "LLMMAN_INSECURE_REGISTRIES": pool.registry.netloc})
    try:
        def seen() -> bool:
            nodes = httpx.get(front.url + "/llmman/pool", headers=HOP, timeout=10).json()["nodes"]
            return nodes[1]["last_seen"] is not None and nodes[1]["stored"] >= 1

        wait_until(seen, "front2 to have seen gone storing its model")
        gone.stop()
        answer = post(front, "/api/chat", name)
        assert answer.status_code == 404, answer.text
        assert any("/ai/gone" in line for line in pool.registry.seen), pool.registry.seen
        assert "taken for busy, not dead" not in front.log_text()
    finally:
        front.stop()
        if gone.process.poll() is None:
            gone.stop()
