"""Fault injection against a real ``llmman serve`` whose llama-server is the fake
(tests/fakes/fake_llama_server.py): split UTF-8, a child killed mid-stream, failed and stalled loads,
a slow load next to a fast model, a client that goes away, and SIGTERM with a stream in flight.

One shared daemon plays every behaviour through ``FAKE_PER_MODEL`` (one store model per behaviour);
the SIGTERM tests get their own daemons since they stop them.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import re
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import Daemon, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPLY = "Grüße 日本語 🙂 ok"
LONG_REPLY = " ".join(f"wörd{i}" for i in range(400))
CRASH_REPLY = "one two three four five six"


def ref(name: str) -> str:
    return f"docker.io/ai/{name}:latest"


def fake_daemon(tmp: Path, env: dict[str, str], names: tuple[str, ...] = ("tiny",)) -> Daemon:
    """A daemon over a store of tiny GGUFs, the fake as its llama-server."""
    make_store(tmp, names)
    (tmp / "bin").mkdir()
    binary = make_fake_binary(tmp / "bin")
    return start_daemon(tmp, extra_env={"LLMMAN_LLAMA_SERVER": str(binary), **env})


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def ps(daemon: Daemon) -> list[dict[str, Any]]:
    models = httpx.get(daemon.url + "/api/ps", timeout=10).json()["models"]
    assert isinstance(models, list)
    return models


def ps_entry(daemon: Daemon, name: str) -> dict[str, Any] | None:
    """The loaded (or loading) row of ``name`` in ``/api/ps``; rows of failed models are skipped."""
    return next((m for m in ps(daemon) if m["name"] == ref(name)
                 and not str(m.get("processor", "")).startswith("failed")), None)  # fmt: skip


def crashes(daemon: Daemon, name: str) -> int:
    """How many times in a row ``name`` has crashed, from the ``failure`` field of its ``/api/ps`` row."""
    for m in ps(daemon):
        if m["name"] == ref(name) and "failure" in m:
            return int(re.search(r"(\d+) time", str(m["failure"])).group(1))  # type: ignore[union-attr]
    return 0


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def fake_url(pid: int) -> str:
    """The base URL of the fake child ``pid`` (its ``--port`` argument)."""
    argv = psutil.Process(pid).cmdline()
    return f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"


def fake_stats(pid: int) -> dict[str, int]:
    stats = httpx.get(fake_url(pid) + "/fake/stats", timeout=5).json()
    assert isinstance(stats, dict)
    return stats


def sse_payloads(raw: bytes) -> list[str]:
    text = raw.decode("utf-8")  # strict: a character torn by llmman fails here
    return [line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: ")]


def chat(name: str, **extra: Any) -> dict[str, Any]:
    return {"model": name, "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The shared daemon: ``tiny`` answers REPLY cut inside characters; the others misbehave."""
    tmp = tmp_path_factory.mktemp("faults")
    gate = tmp / "slowload.go"
    per_model = {
        ref("crashy"): {"FAKE_CRASH_AFTER_TOKENS": "3", "FAKE_TOKEN_DELAY": "0.01",
                        "FAKE_REPLY": CRASH_REPLY},
        ref("badload"): {"FAKE_EXIT_ON_LOAD": "1"},
        ref("hang"): {"FAKE_SILENT_HANG": "1"},
        ref("slowload"): {"FAKE_LOAD_GATE": str(gate)},
        ref("abandoned"): {"FAKE_LOAD_GATE": str(tmp / "abandoned.go")},
        ref("drip"): {"FAKE_TOKEN_DELAY": "0.05", "FAKE_REPLY": LONG_REPLY, "FAKE_SPLIT_BYTES": "0"},
        ref("oomy"): {"FAKE_OOM_ABOVE_CTX": "1024"},
    }
    env = {"FAKE_REPLY": REPLY, "FAKE_SPLIT_BYTES": "1", "FAKE_PER_MODEL": json.dumps(per_model),
           "LLMMAN_LOAD_TIMEOUT": "1s", "LLMMAN_SHUTDOWN_GRACE": "5s"}  # fmt: skip
    d = fake_daemon(tmp, env, ("tiny", "crashy", "badload", "hang", "slowload", "abandoned", "drip",
                                "pinned", "oomy"))
    yield d
    if d.process.poll() is None:
        d.stop(signal.SIGTERM)


@pytest.fixture()
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with daemon.client(timeout=60) as c:
        yield c


# ------------------------------------------------------------------------------------------ UTF-8
def test_fake_really_splits_inside_a_character(daemon: Daemon, client: httpx.Client) -> None:
    """The premise of the UTF-8 tests: some HTTP chunk from the fake ends inside a character."""
    client.post("/api/generate", json={"model": "tiny"}).raise_for_status()
    (entry,) = [m for m in ps(daemon) if m["name"] == ref("tiny")]
    url = httpx.URL(fake_url(entry["pid"]))
    conn = http.client.HTTPConnection(url.host, url.port, timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps(chat("tiny", stream=True)),
                 {"Content-Type": "application/json"})  # fmt: skip
    resp = conn.getresponse()
    sock = resp.fp  # read the chunked framing ourselves: one frame per write of the fake
    frames: list[bytes] = []
    while size := int(sock.readline().strip(), 16):
        frames.append(sock.read(size))
        sock.readline()
    conn.close()
    torn = 0
    for frame in frames:
        try:
            frame.decode("utf-8")
        except UnicodeDecodeError:
            torn += 1
    assert torn >= 3  # every multi-byte token arrives torn
    assert REPLY.encode() not in b"".join(frames)  # tokens are separate events
    text = "".join(json.loads(p)["choices"][0]["delta"].get("content") or ""
                   for p in sse_payloads(b"".join(frames))[:-1])  # fmt: skip
    assert text == REPLY


@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
def test_utf8_survives_on_ollama_streaming(client: httpx.Client, route: str) -> None:
    body = chat("tiny") if route == "/api/chat" else {"model": "tiny", "prompt": "hi"}
    raw = b""
    with client.stream("POST", route, json=body) as resp:
        assert resp.status_code == 200
        for piece in resp.iter_raw():
            raw += piece
    assert "\ufffd".encode() not in raw
    lines = [json.loads(line) for line in raw.decode("utf-8").splitlines()]
    key: Callable[[dict[str, Any]], str] = (
        (lambda o: o["message"]["content"]) if route == "/api/chat" else (lambda o: o["response"])
    )
    assert "".join(key(o) for o in lines) == REPLY
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"


@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
def test_utf8_survives_on_ollama_stream_false(client: httpx.Client, route: str) -> None:
    body = chat("tiny", stream=False) if route == "/api/chat" else {"model": "tiny", "prompt": "x",
                                                                      "stream": False}  # fmt: skip
    obj = json.loads(client.post(route, json=body).content.decode("utf-8"))
    assert (obj["message"]["content"] if route == "/api/chat" else obj["response"]) == REPLY


def test_utf8_survives_on_openai_streaming(client: httpx.Client) -> None:
    raw = b""
    with client.stream("POST", "/v1/chat/completions", json=chat("tiny", stream=True)) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for piece in resp.iter_raw():
            raw += piece
    payloads = sse_payloads(raw)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == REPLY


def test_utf8_survives_on_openai_non_streaming(client: httpx.Client) -> None:
    resp = client.post("/v1/chat/completions", json=chat("tiny"))
    assert resp.status_code == 200
    assert json.loads(resp.content.decode("utf-8"))["choices"][0]["message"]["content"] == REPLY


# ------------------------------------------------------------------------- child killed mid-stream
def test_child_killed_mid_stream_on_the_ollama_route(daemon: Daemon, client: httpx.Client) -> None:
    assert client.post("/api/chat", json={"model": "crashy"}).json()["done_reason"] == "load"
    before = crashes(daemon, "crashy")
    entry = ps_entry(daemon, "crashy")
    assert entry is not None
    first_pid = entry["pid"]
    with client.stream("POST", "/api/chat", json=chat("crashy")) as resp:
        assert resp.status_code == 200
        lines = [json.loads(line) for line in resp.iter_lines()]
    assert "".join(o["message"]["content"] for o in lines[:-1]) == "one two three"
    assert set(lines[-1]) == {"error"} and isinstance(lines[-1]["error"], str)
    assert "stopped mid-answer" in lines[-1]["error"]
    assert not any(o.get("done") for o in lines)
    # Noticed at once by the child watcher, not at the next request (none is made meanwhile); the
    # model was busy, so it is restarted after its backoff (healing): /api/ps says why.
    wait_until(lambda: crashes(daemon, "crashy") > before, "the crash to show in /api/ps")
    assert not alive(first_pid)

    again = client.post("/api/chat", json=chat("crashy", stream=False, options={"num_predict": 2}))
    assert again.status_code == 200, again.text
    assert again.json()["message"]["content"] == "one two"
    entry = ps_entry(daemon, "crashy")
    assert entry is not None and entry["pid"] != first_pid and alive(entry["pid"])


def test_child_killed_mid_stream_on_the_openai_route(daemon: Daemon, client: httpx.Client) -> None:
    before = crashes(daemon, "crashy")
    raw = b""
    with client.stream("POST", "/v1/chat/completions", json=chat("crashy", stream=True)) as resp:
        assert resp.status_code == 200
        for piece in resp.iter_raw():
            raw += piece
    payloads = sse_payloads(raw)
    assert "[DONE]" not in payloads
    last = json.loads(payloads[-1])
    assert set(last) == {"error"}
    assert isinstance(last["error"]["message"], str) and "stopped mid-answer" in last["error"]["message"]
    tokens = [json.loads(p)["choices"][0]["delta"].get("content") for p in payloads[:-1]]
    assert "".join(t or "" for t in tokens) == "one two three"
    wait_until(lambda: crashes(daemon, "crashy") > before, "the crash to show in /api/ps")

    again = client.post("/v1/chat/completions", json=chat("crashy", max_tokens=2))
    assert again.status_code == 200
    assert again.json()["choices"][0]["message"]["content"] == "one two"


@pytest.mark.parametrize("route", ["/api/chat", "/v1/chat/completions"])
def test_child_killed_during_a_non_streaming_answer_is_a_500(daemon: Daemon, client: httpx.Client,
                                                             route: str) -> None:  # fmt: skip
    before = crashes(daemon, "crashy")
    resp = client.post(route, json=chat("crashy", stream=False))
    assert resp.status_code == 500
    err = resp.json()["error"]
    message = err if route == "/api/chat" else err["message"]
    assert isinstance(message, str) and "llama-server for docker.io/ai/crashy:latest" in message
    wait_until(lambda: crashes(daemon, "crashy") > before, "the crash to show in /api/ps")


def test_kill_9_of_a_pinned_models_child_brings_it_back(daemon: Daemon, client: httpx.Client) -> None:
    assert client.post("/api/generate", json={"model": "pinned", "keep_alive": -1}).status_code == 200
    entry = ps_entry(daemon, "pinned")
    assert entry is not None
    first = entry["pid"]
    psutil.Process(first).kill()
    wait_until(lambda: (e := ps_entry(daemon, "pinned")) is not None and e["pid"] != first
               and e["processor"] == "llama-server", "the pinned model to be restarted")  # fmt: skip
    entry = ps_entry(daemon, "pinned")
    assert entry is not None and "crashed 1 time(s) in a row: killed by a signal" in entry["failure"]
    assert "restarting docker.io/ai/pinned:latest" in daemon.log_text()
    again = client.post("/api/chat", json=chat("pinned", stream=False))
    assert again.status_code == 200 and ps_entry(daemon, "pinned")["pid"] == entry["pid"]  # type: ignore[index]


# ---------------------------------------------------------------------------------- failed loads
def llama_children(daemon: Daemon) -> list[psutil.Process]:
    return [p for p in daemon.children() if p.status() != psutil.STATUS_ZOMBIE]


def test_child_exiting_while_loading_is_a_500_with_its_last_lines(daemon: Daemon,
                                                                   client: httpx.Client) -> None:  # fmt: skip
    before = {p.pid for p in llama_children(daemon)}
    resp = client.post("/api/generate", json={"model": "badload", "prompt": "hi"})
    assert resp.status_code == 500
    error = resp.json()["error"]
    assert "exited with code 1 while loading" in error  # noticed by its exit, not by a timer
    assert "error loading model: fake failure" in error
    assert "exiting due to model loading error" in error
    assert ps_entry(daemon, "badload") is None
    assert {p.pid for p in llama_children(daemon)} <= before  # nothing new left running

    # Cooling down: a 503 with Retry-After naming the cause, and no child is spawned for it.
    (failed,) = [m for m in ps(daemon) if m["name"] == ref("badload")]
    assert failed["processor"] == "failed (corrupt or unsupported model file)"
    assert "failed to load 1 time(s)" in failed["failure"] and "fake failure" in failed["error"]
    oai = client.post("/v1/chat/completions", json=chat("badload", stream=True))
    assert oai.status_code == 503, oai.text
    assert int(oai.headers["Retry-After"]) >= 1
    assert "fake failure" in oai.json()["error"]["message"]
    assert "corrupt or unsupported model file" in oai.json()["error"]["message"]
    assert {p.pid for p in llama_children(daemon)} <= before


def test_out_of_memory_load_is_retried_once_with_half_the_context(daemon: Daemon,
                                                                 client: httpx.Client) -> None:  # fmt: skip
    body = chat("oomy", stream=False, options={"num_ctx": 2048})
    resp = client.post("/api/chat", json=body)
    assert resp.status_code == 200, resp.text
    entry = ps_entry(daemon, "oomy")
    assert entry is not None and entry["context_length"] == 1024
    argv = psutil.Process(entry["pid"]).cmdline()
    slots = int(argv[argv.index("-np") + 1])
    assert argv[argv.index("-c") + 1] == str(1024 * slots)  # the child itself has the smaller context
    assert ("docker.io/ai/oomy:latest ran out of memory with n_ctx 2048; retrying once with n_ctx 1024"
            in daemon.log_text())
    again = client.post("/api/chat", json=body)  # the same num_ctx again: no reload, no second OOM
    assert again.status_code == 200 and ps_entry(daemon, "oomy")["pid"] == entry["pid"]  # type: ignore[index]


def test_silent_hang_hits_the_load_timeout_then_a_good_load_works(daemon: Daemon,
                                                                   client: httpx.Client) -> None:  # fmt: skip
    before = {p.pid for p in llama_children(daemon)}
    resp = client.post("/api/chat", json=chat("hang"))
    assert resp.status_code == 500
    error = resp.json()["error"]
    assert "load stall timeout 1 s" in error and "was killed" in error
    assert ps_entry(daemon, "hang") is None
    assert {p.pid for p in llama_children(daemon)} <= before

    good = client.post("/api/chat", json=chat("tiny", stream=False))
    assert good.status_code == 200
    assert good.json()["message"]["content"] == REPLY


# ------------------------------------------------------------------------------ slow load vs. fast
def test_slow_load_of_one_model_does_not_block_another(daemon: Daemon, client: httpx.Client) -> None:
    gate = Path(json.loads(daemon.env["FAKE_PER_MODEL"])[ref("slowload")]["FAKE_LOAD_GATE"])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(lambda: httpx.post(daemon.url + "/api/generate", timeout=60,
                                              json={"model": "slowload", "prompt": "hi", "stream": False}))
        wait_until(lambda: (e := ps_entry(daemon, "slowload")) is not None
                   and e["processor"] == "llama-server (loading)", "slowload to be loading")  # fmt: skip
        fast = client.post("/api/chat", json=chat("tiny", stream=False))
        assert fast.status_code == 200 and fast.json()["message"]["content"] == REPLY
        entry = ps_entry(daemon, "slowload")
        assert entry is not None and entry["processor"] == "llama-server (loading)"  # still loading
        assert not slow.done()
        gate.touch()  # let the slow load finish
        answer = slow.result(timeout=60)
    assert answer.status_code == 200
    assert answer.json()["response"] == REPLY


# ----------------------------------------------------------------------------- client disconnect
def send_raw(daemon: Daemon, route: str, body: dict[str, Any]) -> socket.socket:
    """Send one POST on a raw socket (the caller closes it to disconnect)."""
    url = httpx.URL(daemon.url)
    sock = socket.create_connection((url.host, url.port or 80), timeout=10)
    payload = json.dumps(body).encode()
    sock.sendall(f"POST {route} HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)  # fmt: skip
    return sock


def test_client_leaving_during_a_load_leaves_no_stuck_model(daemon: Daemon) -> None:
    """The waiting request is dropped and, nobody else waiting, its load is cancelled: the child is killed
    before it finished loading (no stray copy kept for its keep_alive)."""
    with send_raw(daemon, "/api/chat", chat("abandoned", stream=False)):
        wait_until(lambda: (e := ps_entry(daemon, "abandoned")) is not None
                   and e["processor"] == "llama-server (loading)", "the model to be loading")  # fmt: skip
        (child,) = [c for c in daemon.children() if ref("abandoned") in " ".join(c.cmdline())]
    wait_until(lambda: ps_entry(daemon, "abandoned") is None, "the abandoned load to be cancelled")
    wait_until(lambda: not alive(child.pid), "the abandoned child to be killed")
    log = (daemon.home.parent / "logs" / "docker.io_ai_abandoned_latest.log").read_text()
    assert "main: model loaded" not in log
    assert "request: POST" not in log  # nothing was generated for the client that left


@pytest.mark.parametrize("route", ["/api/chat", "/v1/chat/completions"])
def test_client_disconnect_cancels_upstream_and_releases_the_lease(daemon: Daemon, route: str) -> None:
    body = chat("drip", stream=True)
    with daemon.client(timeout=30) as c, c.stream("POST", route, json=body) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(3)]  # tokens are flowing
        entry = ps_entry(daemon, "drip")
        assert entry is not None
        pid = entry["pid"]
        assert fake_stats(pid)["active"] == 1
    assert got  # the stream closed here, hundreds of tokens early
    wait_until(lambda: fake_stats(pid)["active"] == 0, "the upstream stream to be cancelled")
    stats = fake_stats(pid)
    assert stats["disconnected"] == stats["started"] and stats["completed"] == 0

    unload = httpx.post(daemon.url + "/api/generate", json={"model": "drip", "keep_alive": 0}, timeout=30)
    assert unload.json()["done_reason"] == "unload"
    assert ps_entry(daemon, "drip") is None  # unloaded at once: no lease was left behind
    assert not alive(pid)


@pytest.mark.parametrize(
    ("route", "body"),
    [("/api/chat", chat("drip", stream=False)),
     ("/api/generate", {"model": "drip", "prompt": "hi", "stream": False}),
     ("/v1/chat/completions", chat("drip")),
     ("/v1/completions", {"model": "drip", "prompt": "hi"})],
)  # fmt: skip
def test_client_disconnect_during_a_non_streaming_answer_cancels_upstream(
    daemon: Daemon, route: str, body: dict[str, Any]
) -> None:
    load = httpx.post(daemon.url + "/api/generate", json={"model": "drip"}, timeout=30)
    assert load.json()["done_reason"] == "load"
    entry = ps_entry(daemon, "drip")
    assert entry is not None
    pid = entry["pid"]
    before = fake_stats(pid)
    with send_raw(daemon, route, body):
        wait_until(lambda: fake_stats(pid)["active"] == 1, "the generation to start")
    wait_until(lambda: fake_stats(pid)["active"] == 0, "the upstream generation to be cancelled")
    after = fake_stats(pid)
    assert after["disconnected"] == before["disconnected"] + 1
    assert after["completed"] == before["completed"]

    unload = httpx.post(daemon.url + "/api/generate", json={"model": "drip", "keep_alive": 0}, timeout=30)
    assert unload.json()["done_reason"] == "unload"
    assert ps_entry(daemon, "drip") is None  # no lease was left behind


# -------------------------------------------------------------------------------------- SIGTERM
def _sigterm_during_stream(tmp: Path, extra: dict[str, str]) -> tuple[list[int], list[dict[str, Any]]]:
    """Stream a chat, SIGTERM the daemon after the first line, read to the end; the child pids and lines."""
    reply = " ".join(f"t{i}" for i in range(20))
    env = {"FAKE_TOKEN_DELAY": "0.05", "FAKE_REPLY": reply, **extra}
    d = fake_daemon(tmp, env)
    try:
        lines: list[dict[str, Any]] = []
        with d.client(timeout=60) as c, c.stream("POST", "/api/chat", json=chat("tiny")) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                lines.append(json.loads(line))
                if len(lines) == 1:
                    pids = [p.pid for p in d.children()]
                    assert pids
                    d.process.send_signal(signal.SIGTERM)
        assert d.process.wait(timeout=60) == 0
    finally:
        if d.process.poll() is None:
            d.process.kill()
    assert "".join(o["message"]["content"] for o in lines) == reply
    return pids, lines


def test_sigterm_lets_the_stream_finish_then_stops_the_child(tmp_path: Path) -> None:
    pids, lines = _sigterm_during_stream(tmp_path, {})
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    assert not any(alive(pid) for pid in pids)
    child_log = (tmp_path / "logs" / "docker.io_ai_tiny_latest.log").read_text()
    assert "stopping: SIGTERM" in child_log and "SIGKILL" not in child_log


def test_sigterm_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    pids, lines = _sigterm_during_stream(tmp_path, {"FAKE_IGNORE_SIGTERM": "1"})
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    assert not any(alive(pid) for pid in pids)
    child_log = (tmp_path / "logs" / "docker.io_ai_tiny_latest.log").read_text()
    assert "still running after the grace period: SIGKILL" in child_log
