"""Overload is not failure (issue 17, target 3): past capacity a client gets 503 ``server busy`` with
``Retry-After`` at once, in its dialect, alone or through a hop; a client that leaves mid-stream frees
its slot and its queue place at once.

Two daemons whose llama-server is the fake llama-server at fixed capacity (``FAKE_SLOTS``: one slot;
``server.num_parallel`` 1, ``server.max_queue`` 1), each storing ``m``, whose answer is 3,000 tokens at
0.2 s a token (ten minutes): a request that waited for a held one would not end within the clients'
30 s limit, so an answer at all shows it was not queued behind it. Requests sent with ``x-llmman-hop``
are served by the node they reach (a peer forwarded them); ``front`` without it places over the pool.
No test asserts a duration.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from llmman.errors import ServerBusy
from tests.integration.daemons import HOP, Daemon, free_port, wait_until
from tests.integration.test_aggregation_failover import fake_daemon, hold, node_doc, saturated

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NODE = "x-llmman-node"
LONG = " ".join(f"x{i}" for i in range(3000))
BUSY_TEXT = ServerBusy().message
ROUTES = ["/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions", "/v1/messages",
          "/v1/responses"]
STREAMED = ["/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions", "/v1/responses"]


@dataclass
class Pair:
    front: Daemon
    back: Daemon


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    hosts = "127.0.0.71", "127.0.0.72"
    ports = free_port(hosts[0]), free_port(hosts[1])
    env = {"LLMMAN_NUM_PARALLEL": "1", "LLMMAN_MAX_QUEUE": "1", "FAKE_SLOTS": "1", "FAKE_TOKEN_DELAY": "0.2",
           "FAKE_REPLY": LONG}
    started: list[Daemon] = []
    try:
        back = fake_daemon(tmp_path_factory.mktemp("back"), hosts[1], ports[1], "node-back", ("m",),
                           {**env, "LLMMAN_PEERS": f"{hosts[0]}:{ports[0]}"})
        started.append(back)
        front = fake_daemon(tmp_path_factory.mktemp("front"), hosts[0], ports[0], "node-front", ("m",),
                            {**env, "LLMMAN_PEERS": f"{hosts[1]}:{ports[1]}"})
        started.append(front)
        yield Pair(front, back)
    finally:
        for d in started:
            d.stop()


def body(path: str, model: str, *, stream: bool, limit: int | None = None) -> dict[str, Any]:
    """A request for ``model`` in ``path``'s dialect; ``limit`` caps the tokens generated."""
    out: dict[str, Any]
    if path in ("/api/generate", "/v1/completions"):
        out = {"model": model, "prompt": "hi", "stream": stream}
    elif path == "/v1/responses":
        out = {"model": model, "input": "hi", "stream": stream}
    else:
        out = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    if path == "/v1/messages":
        out["max_tokens"] = limit or 16
    elif limit is not None:
        if path.startswith("/api/"):
            out["options"] = {"num_predict": limit}
        elif path == "/v1/responses":
            out["max_output_tokens"] = limit
        else:
            out["max_tokens"] = limit
    return out


def error_message(path: str, answer: httpx.Response) -> str:
    """The error's message, read where ``path``'s dialect puts it (test_busy_not_down uses it too)."""
    doc = answer.json()
    if path == "/v1/messages":
        assert doc["type"] == "error", doc
        return str(doc["error"]["message"])
    if path.startswith("/v1/"):
        return str(doc["error"]["message"])
    assert isinstance(doc["error"], str), doc
    return doc["error"]


def busy(path: str, answer: httpx.Response) -> None:
    """``answer`` is the dialect's 503 ``server busy`` with ``Retry-After``."""
    assert answer.status_code == 503, (path, answer.status_code, answer.text)
    assert int(answer.headers["Retry-After"]) >= 1, path
    assert answer.headers["content-type"].startswith("application/json"), path
    assert error_message(path, answer) == BUSY_TEXT, path


@pytest.mark.parametrize("path", ROUTES)
def test_past_capacity_a_node_answers_503_with_retry_after_at_once(pair: Pair, path: str) -> None:
    with saturated(pair.back, "m"):
        answer = httpx.post(pair.back.url + path, json=body(path, "m", stream=True), headers=HOP, timeout=30)
        busy(path, answer)
        assert answer.headers[NODE] == "node-back"


@pytest.mark.parametrize("path", ROUTES)
def test_past_capacity_of_the_pool_the_client_gets_503_with_retry_after_through_a_hop(pair: Pair,
                                                                                      path: str) -> None:
    with saturated(pair.back, "m"), saturated(pair.front, "m"):
        answer = httpx.post(pair.front.url + path, json=body(path, "m", stream=True), timeout=30)
        busy(path, answer)
    assert "peer " in pair.front.log_text() and " 503 before its first byte" in pair.front.log_text()


def raw(d: Daemon, path: str, payload: dict[str, Any]) -> socket.socket:
    """``payload`` POSTed to ``d`` with ``x-llmman-hop`` (served there) on a socket the test closes."""
    data = json.dumps(payload).encode()
    host, port = d.url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                 f"x-llmman-hop: 1\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return conn


@pytest.mark.parametrize("path", STREAMED)
def test_a_client_leaving_mid_stream_frees_its_slot_and_its_queue_place(pair: Pair, path: str) -> None:
    d = pair.back
    streaming = raw(d, path, body(path, "m", stream=True))
    wait_until(lambda: node_doc(d)["in_flight"] == 1, "the stream to hold the one slot")
    assert streaming.recv(1)  # its answer has begun
    waiting = raw(d, path, body(path, "m", stream=True))
    wait_until(lambda: node_doc(d)["queued"] == 1, "a second stream queueing for the slot")
    # The queue is full; the waiting client leaves: its place is free for the next one at once.
    waiting.close()
    wait_until(lambda: node_doc(d)["queued"] == 0, "the queue place to be given back")
    third = raw(d, path, body(path, "m", stream=True))
    wait_until(lambda: node_doc(d)["queued"] == 1, "a third stream taking the queue place")
    third.close()
    wait_until(lambda: node_doc(d)["queued"] == 0, "the third to leave")
    # The streaming client leaves mid-answer: the slot is free, and the next request is served.
    streaming.close()
    answer = httpx.post(d.url + path, json=body(path, "m", stream=False, limit=3), headers=HOP, timeout=30)
    assert answer.status_code == 200, answer.text
    wait_until(lambda: node_doc(d)["in_flight"] == 0 and node_doc(d)["queued"] == 0, "the node idle")


def test_a_held_stream_keeps_its_slot_the_control(pair: Pair) -> None:
    """The control for the test above: while a stream holds the one slot, a request waits for it (its
    client gives up first), so a served request there does show the slot was freed."""
    d = pair.back
    held = hold(d, "m")
    try:
        wait_until(lambda: node_doc(d)["in_flight"] == 1, "the stream to hold the one slot")
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(d.url + "/api/chat", json=body("/api/chat", "m", stream=False, limit=3), headers=HOP,
                       timeout=httpx.Timeout(30, read=3))
    finally:
        held.close()
    wait_until(lambda: node_doc(d)["in_flight"] == 0 and node_doc(d)["queued"] == 0, "the node idle")
