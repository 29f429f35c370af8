"""Fault catalogue: sustained load and queue overflow, against a real ``llmman serve`` over the fake
llama-server (a fixed per-token delay, so the run is bounded and its length does not depend on the
machine's speed).

* 64 concurrent streams, several rounds of a few hundred tokens each, while the child leaves
  ``/health`` unanswered whenever it streams (``FAKE_HEALTH_MUTE``, as llama-server under 64 streams)
  and the watchdog probes every 200 ms: every stream completes on the one child, and the daemon's RSS
  and open descriptors after the run are those after a warm-up round, within a tolerance (a leak of a
  connection, a lease or a buffer per request would show as hundreds).
* Queue overflow: far more requests than slots plus queue: the excess gets Ollama's 503 with
  ``Retry-After`` at once, the rest complete, and nothing is left held (no queued or in-flight
  request, the model unloads at once, one child).
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.integration.daemons import Daemon
from tests.integration.test_faults_fake import alive, chat, crashes, fake_daemon, ps_entry, ref, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

STREAMS = 64
TOKENS = 200
REPLY = " ".join(f"t{i}" for i in range(TOKENS))
ROUTES = ("/api/chat", "/v1/chat/completions")
BUSY_TEXT = "server busy, please try again.  maximum pending requests exceeded"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp: Path = tmp_path_factory.mktemp("load")
    per_model = {ref("tiny"): {"FAKE_TOKEN_DELAY": "0.005", "FAKE_REPLY": REPLY, "FAKE_HEALTH_MUTE": "1"},
                 ref("queued"): {"FAKE_TOKEN_DELAY": "0.02", "FAKE_REPLY": "a b c d e f g h i j",
                                  "FAKE_LOAD_DELAY": "2"}}
    env = {"FAKE_PER_MODEL": json.dumps(per_model), "LLMMAN_NUM_PARALLEL": str(STREAMS),
           "LLMMAN_HEALTH_INTERVAL": "200ms", "LLMMAN_MAX_QUEUE": "4",
           "LLMMAN_SHUTDOWN_GRACE": "5s"}  # fmt: skip
    d = fake_daemon(tmp, env, ("tiny", "queued"))
    yield d
    if d.process.poll() is None:
        d.stop(signal.SIGTERM)


def stream(d: Daemon, route: str) -> str:
    """One streamed answer read to its end; the text of its tokens."""
    text = ""
    with httpx.stream("POST", d.url + route, json=chat("tiny", stream=True), timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if route == "/api/chat" and line:
                obj = json.loads(line)
                assert "error" not in obj, obj
                text += obj["message"]["content"]
            elif line.startswith("data: {"):
                obj = json.loads(line.removeprefix("data: "))
                assert "error" not in obj, obj
                text += "".join(c["delta"].get("content") or "" for c in obj["choices"])
    return text


def round_of(d: Daemon) -> None:
    with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        texts = list(pool.map(lambda n: stream(d, ROUTES[n % 2]), range(STREAMS)))
    assert texts == [REPLY] * STREAMS


def idle(d: Daemon) -> bool:
    node = httpx.get(d.url + "/llmman/node", timeout=10).json()
    return node["queued"] == 0 and node["in_flight"] == 0


def usage(d: Daemon) -> tuple[int, int]:
    proc = psutil.Process(d.process.pid)
    return proc.memory_info().rss, proc.num_fds()


def test_64_streams_leave_rss_and_descriptors_as_they_were(daemon: Daemon) -> None:
    assert httpx.post(daemon.url + "/api/generate", json={"model": "tiny"}, timeout=30).status_code == 200
    entry = ps_entry(daemon, "tiny")
    assert entry is not None
    pid = entry["pid"]
    round_of(daemon)  # warm-up: buffers, pools and caches reach their size
    wait_until(lambda: idle(daemon), "every lease to be released")
    rss_before, fds_before = usage(daemon)
    for _ in range(2):
        round_of(daemon)
    wait_until(lambda: idle(daemon), "every lease to be released")
    rss_after, fds_after = usage(daemon)
    assert fds_after <= fds_before + 8, (fds_before, fds_after)
    assert rss_after <= rss_before * 1.25 + 16 * 2**20, (rss_before, rss_after)
    after = ps_entry(daemon, "tiny")
    assert after is not None and after["pid"] == pid and alive(pid)  # never taken for hung
    assert crashes(daemon, "tiny") == 0 and f"(pid {pid}) is hung" not in daemon.log_text()
    assert [p.pid for p in daemon.children() if alive(p.pid)] == [pid]


def test_queue_overflow_refuses_the_excess_and_leaks_nothing(daemon: Daemon) -> None:
    """``queued`` has 64 slots too, so the queue here is the wait for its load: 40 requests arrive
    while it loads, 4 may wait, the rest are refused at once."""
    body = chat("queued", stream=False)
    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(lambda _: httpx.post(daemon.url + "/api/chat", json=body, timeout=60),
                                range(40)))  # fmt: skip
    busy = [r for r in answers if r.status_code == 503]
    done = [r for r in answers if r.status_code == 200]
    assert busy and done and len(busy) + len(done) == 40, [r.status_code for r in answers]
    for r in busy:
        assert r.json() == {"error": BUSY_TEXT} and int(r.headers["Retry-After"]) >= 1
    for r in done:
        assert r.json()["message"]["content"] == "a b c d e f g h i j"
    assert idle(daemon)
    entry = ps_entry(daemon, "queued")
    assert entry is not None
    pid = entry["pid"]
    unload = httpx.post(daemon.url + "/api/generate", json={"model": "queued", "keep_alive": 0}, timeout=30)
    assert unload.json()["done_reason"] == "unload"
    assert ps_entry(daemon, "queued") is None  # unloaded at once: no lease was left behind
    wait_until(lambda: not alive(pid), "the unloaded child to exit")
