"""Failover before the first byte, silence checks and forward hygiene, in a real aggregation of daemons
whose llama-server is the fake (fixed capacity and timing, so the shared cores are not what is measured).

``a`` (127.0.0.51, ``node-a``, ``spread = off`` so the seed's ranking picks the node under test, stall
check 1 s, one slot and a queue of one) names every other node and serves ``here`` and ``hot`` (slow)
itself; its ``lfail`` fails to load. The peers, each more room than ``c`` so it ranks first for what it
stores:

* ``b`` (``node-b``): ``busy``, one slot, a queue of one, a slow answer: two requests saturate it (503);
* ``p`` (``node-p``): ``broken``, whose load fails;
* ``s`` (``node-s``): ``slowload`` (loads when the test says), ``frozen`` (never finishes loading) and
  ``drip`` (slow tokens); the tests SIGSTOP it (SIGCONT in teardown);
* ``c`` (``node-c``, less room): stores everything but ``here`` and ``drip`` and serves it;
* ``rec``: not a daemon, a recording HTTP server that answers ``/llmman/node`` with ``rec`` loaded and
  records the headers a forward brings.

Every daemon also stores ``doomed``, whose load fails everywhere.

Which node served is read from ``x-llmman-node``; no test asserts a duration. The fake has no
``/v1/messages`` of its own, so an Anthropic request forces a tool (llmman then asks the child's
``/v1/chat/completions`` with a grammar, and the fake's reply becomes the tool's input); the mid-stream
test runs over the dialects whose text the fake streams token by token (Ollama, OpenAI chat, OpenAI
completions).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.integration.daemons import HOP, Daemon, free_port, local_ps, start_daemon, wait_until
from tests.unit.ggufgen import TOOLS_THINK_TEMPLATE, write_gguf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NODE = "x-llmman-node"
FAKE_REPLY = "Hello from the fake llama-server."
DRIP = " ".join(f"w{i}" for i in range(100))


def ref(name: str) -> str:
    return f"docker.io/ai/{name}:latest"


class Recorder:
    """A "peer" that is an HTTP server recording the headers of each forward it gets.

    ``/llmman/node`` lists ``rec`` loaded (and 1 byte of memory, so it ranks last for anything else);
    ``POST /api/chat`` for ``rec`` answers one NDJSON line without naming a node, ``POST /api/generate``
    names itself ``rec-node`` in ``x-llmman-node``; any other model is answered 503 ``rec is busy``, plain
    text.
    """

    def __init__(self, host: str) -> None:
        seen = self.seen = []  # type: list[dict[str, str]]

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, body: bytes, extra: dict[str, str] | None = None) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(orjson.dumps({"memory": 1, "loaded": {ref("rec"): 1}, "stored": {ref("rec"): 1},
                                         "name": "rec-node"}))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                seen.append({k.lower(): v for k, v in self.headers.items()})
                if body.get("model") != "rec":
                    self.send_response(503)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", "11")
                    self.end_headers()
                    self.wfile.write(b"rec is busy")
                    return
                line = {"model": "rec", "message": {"role": "assistant", "content": "recorded"}, "done": True}
                named = {NODE: "rec-node"} if self.path == "/api/generate" else None
                self._send(orjson.dumps(line) + b"\n", named)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.netloc = f"{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fake_daemon(tmp: Path, host: str, port: int, node: str, names: tuple[str, ...],
                env: dict[str, str], per_model: dict[str, dict[str, str]] | None = None) -> Daemon:
    """A daemon whose children are the fake; its models have a tools template (for the forced tool of
    :func:`body_for`); each stores ``doomed``, which fails to load on every one."""
    store = Store(tmp / "store")
    for name in (*names, "doomed"):
        store.build(parse_reference(name), write_gguf(tmp / "gguf" / f"{name}.gguf", name=f"Tiny {name}",
                                                      chat_template=TOOLS_THINK_TEMPLATE))
    (tmp / "bin").mkdir()
    models = {"doomed": {"FAKE_EXIT_ON_LOAD": "1"}, **(per_model or {})}
    return start_daemon(tmp, host=host, port=port, extra_env={
        "LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_DEBUG": "1",
        "LLMMAN_MEMORY": "4GB", "LLMMAN_NODE_NAME": node, "FAKE_PER_MODEL": json.dumps(models), **env})


@dataclass
class Pool:
    a: Daemon
    b: Daemon
    c: Daemon
    p: Daemon
    s: Daemon
    rec: Recorder
    gate: Path
    stopped: set[int] = field(default_factory=set)

    def name(self, d: Daemon) -> str:
        return d.url.removeprefix("http://")

    def stop(self, d: Daemon) -> None:
        os.kill(d.process.pid, signal.SIGSTOP)
        self.stopped.add(d.process.pid)

    def resume(self, d: Daemon) -> None:
        """SIGCONT ``d``; when ``a`` had marked it down, wait until ``a`` takes it back."""
        was_down = self.a.log_text().count(f"peer {self.name(d)} left out")
        back = self.a.log_text().count(f"peer {self.name(d)} is back")
        os.kill(d.process.pid, signal.SIGCONT)
        self.stopped.discard(d.process.pid)
        if was_down > back:
            wait_until(lambda: self.a.log_text().count(f"peer {self.name(d)} is back") > back,
                       f"a to take {self.name(d)} back")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    mk = tmp_path_factory.mktemp
    hosts = {n: f"127.0.0.{i}" for n, i in (("a", 51), ("b", 52), ("c", 53), ("p", 54), ("s", 55))}
    ports = {n: free_port(h) for n, h in hosts.items()}
    gate = mk("gate") / "slowload-may-finish"
    rec = Recorder("127.0.0.56")
    started: list[Daemon] = []
    state: Pool | None = None
    try:
        big = {"LLMMAN_MEMORY": "16GB"}
        b = fake_daemon(mk("b"), hosts["b"], ports["b"], "node-b", ("busy",), {
            **big, "LLMMAN_NUM_PARALLEL": "1", "LLMMAN_MAX_QUEUE": "1", "FAKE_TOKEN_DELAY": "0.2",
            "FAKE_REPLY": " ".join(f"x{i}" for i in range(3000))})
        started.append(b)
        c = fake_daemon(mk("c"), hosts["c"], ports["c"], "node-c",
                        ("busy", "broken", "lfail", "hot", "slowload", "frozen"), {})
        started.append(c)
        p = fake_daemon(mk("p"), hosts["p"], ports["p"], "node-p", ("broken",), {
            **big, "FAKE_EXIT_ON_LOAD": "1"})
        started.append(p)
        s = fake_daemon(mk("s"), hosts["s"], ports["s"], "node-s", ("slowload", "frozen", "drip"), big, {
            "slowload": {"FAKE_LOAD_GATE": str(gate)},
            "frozen": {"FAKE_LOAD_GATE": str(gate.with_name("never"))},
            "drip": {"FAKE_TOKEN_DELAY": "0.3", "FAKE_REPLY": DRIP}})
        started.append(s)
        peers = ", ".join([*(f"{hosts[n]}:{ports[n]}" for n in "bcps"), rec.netloc])
        # a long refresh: a's background probes do not race the forward's own silence check
        a = fake_daemon(mk("a"), hosts["a"], ports["a"], "node-a", ("here", "hot", "lfail"), {
            "LLMMAN_PEERS": peers, "LLMMAN_SPREAD": "off", "LLMMAN_STALL_TIMEOUT": "1s",
            "LLMMAN_PEER_REFRESH": "60s", "LLMMAN_NUM_PARALLEL": "1", "LLMMAN_MAX_QUEUE": "1"}, {
            "lfail": {"FAKE_EXIT_ON_LOAD": "1"},
            "hot": {"FAKE_TOKEN_DELAY": "0.2", "FAKE_REPLY": " ".join(f"h{i}" for i in range(3000))}})
        started.append(a)
        state = Pool(a, b, c, p, s, rec, gate)
        yield state
    finally:
        for pid in state.stopped if state else ():
            os.kill(pid, signal.SIGCONT)
        for d in started:
            for child in d.children():
                child.kill()
            d.stop(signal.SIGKILL if d.process.poll() is None else signal.SIGTERM)
        rec.close()


DIALECTS = ["/api/chat", "/v1/chat/completions", "/v1/messages"]
STREAMED = ["/api/chat", "/v1/chat/completions", "/v1/completions"]  # the fake streams these token by token
TOOL = {"name": "get_weather", "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def body_for(path: str, model: str) -> dict[str, Any]:
    """A streamed request for ``model`` in ``path``'s dialect (Anthropic's forces a tool)."""
    if path == "/v1/completions":
        return {"model": model, "prompt": "hi", "stream": True}
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    if path == "/v1/messages":
        body.update(max_tokens=1000, tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"})
    return body


@dataclass
class Answer:
    status: int
    node: str | None
    text: str  # the streamed content, concatenated
    error: str | None  # the in-band error, or the error body's message


def parse_stream(path: str, lines: list[str]) -> tuple[str, str | None]:
    """(content, in-band error) of a streamed answer in ``path``'s dialect."""
    text, error = [], None
    for line in lines:
        if path == "/api/chat":
            if not line:
                continue
            obj = json.loads(line)
            if "error" in obj:
                error = str(obj["error"])
            text.append(str(obj.get("message", {}).get("content", "")))
        elif line.startswith("data: ") and line != "data: [DONE]":
            obj = json.loads(line.removeprefix("data: "))
            if path == "/v1/messages":
                if obj.get("type") == "error":
                    error = str(obj["error"]["message"])
                elif obj.get("type") == "content_block_delta":
                    delta = obj["delta"]
                    text.append(str(delta.get("text", delta.get("partial_json", ""))))
            elif "error" in obj:
                error = str(obj["error"]["message"])
            else:
                for choice in obj.get("choices", []):
                    text.append(str(choice.get("delta", {}).get("content") or choice.get("text") or ""))
    return "".join(text), error


def send(url: str, path: str, model: str, headers: dict[str, str] | None = None,
         on_line: Any = None) -> Answer:
    """A streamed request; ``on_line(line)`` is called with each line as it comes."""
    with httpx.stream("POST", url + path, json=body_for(path, model), headers=headers, timeout=120) as r:
        if r.status_code != 200:
            data = r.read()
            try:
                err = json.loads(data)["error"]
                message = str(err["message"] if isinstance(err, dict) else err)
            except (ValueError, KeyError, TypeError):
                message = data.decode()
            return Answer(r.status_code, r.headers.get(NODE), "", message)
        lines = []
        for line in r.iter_lines():
            lines.append(line)
            if on_line is not None:
                on_line(line)
        text, error = parse_stream(path, lines)
        return Answer(200, r.headers.get(NODE), text, error)


def node_doc(d: Daemon) -> dict[str, Any]:
    r = httpx.get(d.url + "/llmman/node", headers=HOP, timeout=10)
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    return doc


def hold(d: Daemon, model: str) -> socket.socket:
    """A streamed /api/chat to ``d`` (hopped: served there) on a raw socket, left open by the test."""
    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hold"}]})
    host, port = d.url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=10)
    head = f"POST /api/chat HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n" \
           f"x-llmman-hop: 1\r\nContent-Length: {len(body)}\r\n\r\n"
    conn.sendall(head.encode() + body)
    return conn


@contextlib.contextmanager
def saturated(d: Daemon, model: str) -> Iterator[None]:
    """``model`` loaded on ``d`` (one slot, a queue of one) with its slot taken and its queue full: the
    next request for it there is 503 ``server busy``."""
    first = hold(d, model)
    wait_until(lambda: node_doc(d)["in_flight"] == 1, "one request being served")
    second = hold(d, model)
    try:
        wait_until(lambda: node_doc(d)["queued"] == 1, "a second request queueing")
        yield
    finally:
        first.close()
        second.close()
        wait_until(lambda: node_doc(d)["in_flight"] == 0 and node_doc(d)["queued"] == 0,
                   "the held requests dropped")


@pytest.fixture()
def saturated_b(pool: Pool) -> Iterator[None]:
    with saturated(pool.b, "busy"):
        yield


@pytest.mark.parametrize("path", DIALECTS)
def test_a_busy_peer_503_fails_over_to_the_next_node(pool: Pool, saturated_b: None, path: str) -> None:
    direct = send(pool.b.url, path, "busy", headers=HOP)
    assert direct.status == 503, direct  # what a client of b alone gets: server busy
    answer = send(pool.a.url, path, "busy")
    assert (answer.status, answer.node, answer.error) == (200, "node-c", None), answer
    assert answer.text == FAKE_REPLY
    log = pool.a.log_text()
    assert f"peer {pool.name(pool.b)} answered {path} 503 before its first byte" in log
    assert f"peer {pool.name(pool.b)} left out" not in log  # busy is not down


def test_a_peer_whose_load_fails_is_skipped(pool: Pool) -> None:
    for path in DIALECTS:  # the first fails p's load (500), the next find it cooling down (503)
        answer = send(pool.a.url, path, "broken")
        assert (answer.status, answer.node, answer.error) == (200, "node-c", None), (path, answer)
        assert answer.text == FAKE_REPLY
    log = pool.a.log_text()
    assert f"peer {pool.name(pool.p)} answered /api/chat 500 before its first byte" in log
    assert f"peer {pool.name(pool.p)} left out" not in log
    assert "POST /api/chat forwarded by 'node-a'" in pool.c.log_text()  # the hop header names a


@pytest.mark.parametrize("path", DIALECTS)
def test_when_every_node_fails_the_client_gets_the_last_error_in_its_dialect(pool: Pool, path: str) -> None:
    """``doomed`` fails to load on every daemon; ``rec``, ranked last (the least room, and it does not
    store it), answers it 503 in plain text: that last error reaches the client, in the route's dialect."""
    answer = send(pool.a.url, path, "doomed")
    assert (answer.status, answer.node, answer.error) == (503, pool.rec.netloc, "rec is busy"), answer
    for d in (pool.p, pool.b, pool.s, pool.c):
        assert f"peer {pool.name(d)} answered {path} 5" in pool.a.log_text()
    assert "failed here before its first byte" in pool.a.log_text()
    r = httpx.post(pool.a.url + path, json={**body_for(path, "doomed"), "stream": False}, timeout=60)
    assert r.status_code == 503 and r.headers["content-type"] == "application/json"
    shape = r.json()
    if path == "/v1/messages":
        assert shape["type"] == "error" and shape["error"]["message"] == "rec is busy"
    elif path.startswith("/v1/"):
        assert shape["error"]["message"] == "rec is busy" and "type" in shape["error"]
    else:
        assert shape == {"error": "rec is busy"}


def test_a_local_load_failure_moves_to_a_peer(pool: Pool) -> None:
    answer = send(pool.a.url, "/api/chat", "lfail")
    assert (answer.status, answer.node, answer.error) == (200, "node-c", None), answer
    assert "/api/chat for lfail failed here before its first byte" in pool.a.log_text()
    # a hopped request is its node's alone: a's own failure goes to the client
    hopped = send(pool.a.url, "/api/chat", "lfail", headers=HOP)
    assert hopped.status in (500, 503) and hopped.node == "node-a", hopped


def test_a_full_local_queue_moves_to_a_peer(pool: Pool) -> None:
    with saturated(pool.a, "hot"):
        hopped = send(pool.a.url, "/api/chat", "hot", headers=HOP)
        assert (hopped.status, hopped.node) == (503, "node-a"), hopped  # server busy, here
        answer = send(pool.a.url, "/api/chat", "hot")
        assert (answer.status, answer.node, answer.error) == (200, "node-c", None), answer
    assert "/api/chat for hot failed here before its first byte (server busy" in pool.a.log_text()


def test_a_peer_loading_a_model_is_waited_for_while_it_answers_its_probe(pool: Pool) -> None:
    s = pool.name(pool.s)
    waiting = f"peer {s} silent before answering for 1 s, but it answers its probe: still waiting"
    before = pool.a.log_text().count(waiting)
    result: list[Answer] = []
    request = threading.Thread(target=lambda: result.append(send(pool.a.url, "/api/chat", "slowload")))
    request.start()
    try:
        wait_until(lambda: pool.a.log_text().count(waiting) >= before + 2, "a probing the loading peer twice")
    finally:
        pool.gate.touch()
        request.join(60)
    assert result and (result[0].status, result[0].node, result[0].error) == (200, "node-s", None), result
    assert f"peer {s} left out" not in pool.a.log_text()


def test_a_silent_peer_is_given_up_and_the_next_node_serves(pool: Pool) -> None:
    s = pool.name(pool.s)
    result: list[Answer] = []
    request = threading.Thread(target=lambda: result.append(send(pool.a.url, "/api/chat", "frozen")))
    request.start()
    try:
        # s took the request (a's probe and forward reached it) and is loading: now it goes silent
        wait_until(lambda: node_doc(pool.s)["models"].get(ref("frozen"), {}).get("loading") is True,
                   "s loading frozen")
        pool.stop(pool.s)
        request.join(60)
        assert result and (result[0].status, result[0].node, result[0].error) == (200, "node-c", None), result
        why = f"peer {s} silent before answering for 1 s and not answering its probe"
        assert f"forward of /api/chat to {s} failed before its first byte ({why})" in pool.a.log_text()
        pool.resume(pool.s)
        # Woken, s finds the forward's connection closed: the load nobody waits for is cancelled and
        # its child killed, so the failover leaves no stray copy behind.
        wait_until(lambda: ref("frozen") not in local_ps(pool.s) and not [
            c for c in pool.s.children() if "frozen" in " ".join(c.cmdline())],
            "s to drop the abandoned load")
    finally:
        pool.resume(pool.s)
        request.join(60)


@pytest.mark.parametrize("path", STREAMED)
def test_a_peer_stalling_mid_stream_ends_it_with_an_in_band_error(pool: Pool, path: str) -> None:
    s = pool.name(pool.s)

    def stop_at_first_word(line: str) -> None:
        if "w0" in line and pool.s.process.pid not in pool.stopped:
            pool.stop(pool.s)

    try:
        answer = send(pool.a.url, path, "drip", on_line=stop_at_first_word)
        assert (answer.status, answer.node) == (200, "node-s"), answer
        assert "w0" in answer.text and "w99" not in answer.text
        assert answer.error == f"peer {s} stalled mid-answer", answer
    finally:
        pool.resume(pool.s)


def test_forwards_carry_no_client_credentials_and_name_the_forwarding_node(pool: Pool) -> None:
    secrets = {"Cookie": "session=secret", "Proxy-Authorization": "Basic cHJveHk6c2VjcmV0",
               "Authorization": "Bearer client-key", "x-api-key": "client-key", "x-goog-api-key": "k"}
    before = len(pool.rec.seen)
    r = httpx.post(pool.a.url + "/api/chat", headers=secrets, timeout=60,
                   json={"model": "rec", "messages": [{"role": "user", "content": "hi"}], "stream": False})
    assert r.status_code == 200, r.text
    assert r.headers[NODE] == pool.rec.netloc  # the peer named no node: its address
    assert len(pool.rec.seen) == before + 1
    got = pool.rec.seen[-1]
    assert not {k.lower() for k in secrets} & set(got), got
    assert got["x-llmman-hop"] == "node-a"
    r = httpx.post(pool.a.url + "/api/generate", json={"model": "rec", "prompt": "hi", "stream": False},
                   timeout=60)
    assert r.status_code == 200 and r.headers[NODE] == "rec-node"  # the peer's own name passes through


@pytest.mark.parametrize("path", DIALECTS)
def test_every_answer_names_the_node_that_served_it(pool: Pool, path: str) -> None:
    assert send(pool.a.url, path, "here").node == "node-a"
    assert send(pool.c.url, path, "busy", headers=HOP).node == "node-c"
    missing = send(pool.a.url, path, "nowhere")  # placed on the peer with the most room, which lacks it
    assert missing.status == 404 and missing.node in {"node-b", "node-p", "node-s"}, missing
    assert send(pool.c.url, path, "nowhere", headers=HOP).node == "node-c"  # an error names its node
