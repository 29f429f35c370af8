"""A queued request whose client has gone loads nothing and evicts nothing (issue 14 item 4).

One model fits (``LLMMAN_MAX_LOADED_MODELS=1``). ``drip`` is busy (the fake llama-server, fixed capacity:
one slot, a token every 0.05 s); a request for ``other`` queues for admission, which asks ``drip`` to
drain for it (``/api/ps`` shows ``draining``). Its client disconnects: ``other`` leaves the queue at once,
``drip`` is no longer draining, and when ``drip`` frees up it stays loaded and the next ``drip`` request is
served by the same child; ``other`` was never started, even asked with ``keep_alive: -1``. On every
dialect's chat route, and through a hop (a front daemon storing nothing forwards to the daemon that stores
both models).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import HOP, Daemon, free_port, start_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPLY = " ".join(f"w{i}" for i in range(60))  # 3 s at 0.05 s a token
BUSY = "docker.io/ai/drip:latest"
QUEUED = "docker.io/ai/other:latest"


@dataclass
class Nodes:
    back: Daemon  # stores both models, the fake as its llama-server
    front: Daemon  # stores nothing: its requests go to ``back``


def _daemon(tmp: Path, host: str, port: int, peer: str, names: tuple[str, ...]) -> Daemon:
    make_store(tmp, names)
    (tmp / "bin").mkdir()
    return start_daemon(tmp, host=host, port=port, extra_env={
        "LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_MAX_LOADED_MODELS": "1",
        "LLMMAN_PEERS": peer, "FAKE_REPLY": REPLY, "FAKE_SLOTS": "1",
        "FAKE_PER_MODEL": json.dumps({BUSY: {"FAKE_TOKEN_DELAY": "0.05"}})})


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    hosts = "127.0.0.41", "127.0.0.42"
    ports = free_port(hosts[0]), free_port(hosts[1])
    back = _daemon(tmp_path_factory.mktemp("back"), hosts[1], ports[1], f"{hosts[0]}:{ports[0]}",
                   ("drip", "other"))
    try:
        front = _daemon(tmp_path_factory.mktemp("front"), hosts[0], ports[0], f"{hosts[1]}:{ports[1]}", ())
        try:
            yield Nodes(back, front)
        finally:
            front.stop()
    finally:
        back.stop()


def ps(d: Daemon) -> dict[str, dict[str, Any]]:
    """``d``'s own loaded models by name (its ``/api/ps`` as a hopped request: no peer's entries)."""
    r = httpx.get(d.url + "/api/ps", headers=HOP, timeout=10)
    r.raise_for_status()
    return {str(m["name"]): m for m in r.json()["models"]}


def own_models(d: Daemon) -> dict[str, dict[str, Any]]:
    """This node's models with their in-flight and queued counts (``/llmman/pool``, its own entry)."""
    r = httpx.get(d.url + "/llmman/pool", headers=HOP, timeout=10)
    (me,) = [n for n in r.json()["nodes"] if n["self"]]
    models = me["models"]
    assert isinstance(models, dict)
    return models


ROUTES: dict[str, tuple[str, Any]] = {
    "ollama": ("/api/chat", lambda model: {"model": model, "messages": [{"role": "user", "content": "hi"}]}),
    "ollama-kept-forever": ("/api/chat", lambda model: {"model": model, "keep_alive": -1,
                                                       "messages": [{"role": "user", "content": "hi"}]}),
    "openai": ("/v1/chat/completions", lambda model: {"model": model, "stream": True,
                                                      "messages": [{"role": "user", "content": "hi"}]}),
    "anthropic": ("/v1/messages", lambda model: {"model": model, "max_tokens": 100, "stream": True,
                                                 "messages": [{"role": "user", "content": "hi"}]}),
}


def send_raw(d: Daemon, route: str, body: dict[str, Any]) -> socket.socket:
    """Send one POST on a raw socket (the caller closes it to disconnect)."""
    url = httpx.URL(d.url)
    sock = socket.create_connection((url.host, url.port or 80), timeout=10)
    payload = json.dumps(body).encode()
    sock.sendall(f"POST {route} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)  # fmt: skip
    return sock


@pytest.mark.parametrize("via", ["local", "hop"])
@pytest.mark.parametrize("dialect", list(ROUTES))
def test_a_queued_request_whose_client_left_evicts_nothing(nodes: Nodes, dialect: str, via: str) -> None:
    back = nodes.back
    entry = nodes.front if via == "hop" else back
    route, body = ROUTES[dialect]
    with back.client(timeout=60) as c:
        c.post("/api/generate", json={"model": "drip"}).raise_for_status()  # drip loaded
        pid = ps(back)[BUSY]["pid"]
        with c.stream("POST", route, json=body("drip")) as busy:
            assert busy.status_code == 200
            lines = busy.iter_lines()
            next(lines)  # drip is answering: its only slot is taken

            with send_raw(entry, route, body("other")):
                wait_until(lambda: QUEUED in ps(back) and ps(back)[BUSY].get("draining") is True,
                           "the request for other to queue and ask drip to drain for it")
            # Its client went away: it leaves the queue, and drip is no longer to go.
            wait_until(lambda: QUEUED not in ps(back), "other to leave the queue")
            assert not ps(back)[BUSY].get("draining")
            assert own_models(back)[BUSY]["queued"] == 0
            for _ in lines:  # drip's answer runs to its end
                pass
        wait_until(lambda: own_models(back)[BUSY]["in_flight"] == 0, "drip to free up")
        loaded = ps(back)
        assert list(loaded) == [BUSY] and loaded[BUSY]["pid"] == pid and not loaded[BUSY].get("draining")
        again = c.post("/api/generate", json={"model": "drip", "prompt": "hi", "stream": False})
        assert again.status_code == 200
        assert ps(back)[BUSY]["pid"] == pid  # served by the same child
    assert not [p for p in back.children() if QUEUED in " ".join(p.cmdline())]
    log = back.home.parent / "logs" / "docker.io_ai_other_latest.log"
    assert not log.exists() or "main: model loaded" not in log.read_text()
