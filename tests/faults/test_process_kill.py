"""Fault catalogue: kill -9 of a llama-server child during an answer, on every dialect, streamed and
not (issue 13 items 1 and 10), against a real ``llmman serve`` with the real llama-server and SmolLM2.

Streamed: the child is SIGKILLed once tokens flow; the client must get the dialect's in-band error
frame as the stream's last event (no ``done``, ``[DONE]``, ``message_stop`` or ``response.completed``).
Not streamed: the child is SIGSTOPped, the request sent (the daemon's connection to the child is
ESTABLISHED, its bytes in the child's socket), then SIGKILLed: the client must get a 5xx in the route's
dialect at once. Before the fix the gateway re-sent that request to a fresh child and the client got a
200 after a whole second generation (on /v1/* that was a 120 s client timeout in the attack pass).
After each kill nothing is lost: the killed pid is gone, every llama-server the daemon has is one it
tracks, and the next request on the model is answered.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.integration.conftest import model_file  # noqa: F401  (the fixture)
from tests.integration.daemons import Daemon, model_daemon
from tests.integration.test_faults_fake import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(300)]

NAME = "smollm2:135m"
PROMPT = "Count from 1 to 1000, one number per line."
N = 2000

BODIES: dict[str, dict[str, Any]] = {
    "/api/chat": {"messages": [{"role": "user", "content": PROMPT}],
                  "options": {"num_predict": N, "temperature": 0}},
    "/api/generate": {"prompt": PROMPT, "options": {"num_predict": N, "temperature": 0}},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": N,
                             "temperature": 0},
    # a raw prompt with no chat template: at temperature 0 this one runs to max_tokens; PROMPT may end in a
    # few tokens at the default temperature, before the test has seen the stream flowing
    "/v1/completions": {"prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": N, "temperature": 0},
    "/v1/messages": {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": N, "temperature": 0},
    "/v1/responses": {"input": PROMPT, "max_output_tokens": N, "temperature": 0},
}
EMBEDDINGS: dict[str, dict[str, Any]] = {
    "/api/embed": {"input": "hello"},  # /api/embeddings is the same path (api/embeddings.py)
    "/v1/embeddings": {"input": "hello"},
}
DONE_MARKS = ('"done":true', "[DONE]", "message_stop", "response.completed")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> Iterator[Daemon]:  # noqa: F811
    env = {"LLMMAN_NUM_PARALLEL": "2", "LLMMAN_RESTART_BACKOFF": "100ms", "LLMMAN_SHUTDOWN_GRACE": "5s"}
    with model_daemon(tmp_path_factory.mktemp("kill"), model_file, NAME, extra_env=env) as d:
        yield d


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def child(d: Daemon, embedding: bool) -> psutil.Process:
    """The daemon's one live chat (or embedding) llama-server."""
    found = [p for p in d.children() if alive(p.pid) and ("--embeddings" in p.cmdline()) == embedding]
    assert len(found) == 1, found
    return found[0]


def tracked(d: Daemon) -> None:
    """Nothing lost: every live llama-server of the daemon is one /api/ps shows (no orphan)."""
    pids = {m.get("pid") for m in httpx.get(d.url + "/api/ps", timeout=10).json()["models"]}
    live = [p for p in d.children() if alive(p.pid) and "--embeddings" not in p.cmdline()]
    assert {p.pid for p in live} <= pids, (live, pids)


def load(d: Daemon, embedding: bool = False) -> psutil.Process:
    if embedding:
        r = httpx.post(d.url + "/api/embed", json={"model": NAME, "input": "warm up"}, timeout=120)
    else:
        r = httpx.post(d.url + "/api/generate", json={"model": NAME}, timeout=120)
    assert r.status_code == 200, r.text
    return child(d, embedding)


def recovered(d: Daemon, killed: int) -> None:
    wait_until(lambda: not alive(killed), "the killed child to be reaped", timeout=30)
    answer = httpx.post(d.url + "/api/generate", timeout=120,
                        json={"model": NAME, "prompt": "Say hi.", "stream": False,
                              "options": {"num_predict": 4}})  # fmt: skip
    assert answer.status_code == 200, answer.text
    tracked(d)


@pytest.mark.parametrize("route", list(BODIES))
def test_kill_9_mid_stream_ends_with_the_dialects_error(daemon: Daemon, route: str) -> None:
    proc = load(daemon)
    raw = b""
    with httpx.stream("POST", daemon.url + route, json={"model": NAME, "stream": True, **BODIES[route]},
                      timeout=120) as resp:  # fmt: skip
        assert resp.status_code == 200
        pieces = resp.iter_raw()
        while raw.count(b"\n\n") + raw.count(b"\n") < 12:  # tokens are flowing
            raw += next(pieces)
        proc.kill()
        for piece in pieces:
            raw += piece
    text = raw.decode("utf-8", errors="replace")
    frames = [f for f in (text.split("\n\n") if "data:" in text else text.splitlines()) if f.strip()]
    last = frames[-1]
    assert "stopped mid-answer" in last, last
    if route.startswith("/api/"):
        assert set(json.loads(last)) == {"error"}
    elif route == "/v1/messages":
        assert last.startswith("event: error") and '"type": "error"' in last.replace('":"', '": "')
    elif route == "/v1/responses":
        assert last.startswith("event: error")
    else:
        assert set(json.loads(last.removeprefix("data: "))) == {"error"}
    assert not any(mark in text.replace(" ", "") for mark in DONE_MARKS), last
    recovered(daemon, proc.pid)


def _sent(d: Daemon, proc: psutil.Process) -> bool:
    """The daemon has a connection open to ``proc``'s port (the request is in the child's socket)."""
    argv = proc.cmdline()
    port = int(argv[argv.index("--port") + 1])
    conns = psutil.Process(d.process.pid).net_connections(kind="tcp")
    return any(c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED for c in conns)


@pytest.mark.parametrize("route", [*BODIES, *EMBEDDINGS])
def test_kill_9_during_a_non_streamed_answer_is_a_prompt_5xx(daemon: Daemon, route: str) -> None:
    embedding = route in EMBEDDINGS
    proc = load(daemon, embedding)
    body = {"model": NAME, "stream": False, **(EMBEDDINGS[route] if embedding else BODIES[route])}
    proc.suspend()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(lambda: httpx.post(daemon.url + route, json=body, timeout=120))
        wait_until(lambda: _sent(daemon, proc), "the request to reach the child", timeout=30)
        proc.kill()
        answer = future.result(timeout=120)
    assert 500 <= answer.status_code < 600, (answer.status_code, answer.text)
    error = answer.json()
    if route.startswith("/api/"):
        message = error["error"]
    elif route == "/v1/messages":
        assert error["type"] == "error"
        message = error["error"]["message"]
    else:
        message = error["error"]["message"]
    assert f"llama-server for docker.io/ai/{NAME}" in message and "not sent again" in message, message
    recovered(daemon, proc.pid)
