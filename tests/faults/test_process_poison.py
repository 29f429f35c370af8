"""Fault catalogue: a poison request (issue 13 item 1, the replay part), against a real ``llmman serve``
over the fake llama-server, whose ``FAKE_CRASH_ON`` SIGKILLs the child on any request containing a
marker, before the first byte of its answer (as llama-server segfaults parsing a grammar it cannot
survive).

Before the fix the gateway re-sent a request whose child died before its status line to a fresh
child, so each poison request crashed the model twice, and nothing stopped a client from sending it
again and again. Now it is sent once (a 500 at once), and once it has been in flight for two crashes
the same bytes are refused with 503 ``Retry-After`` without reaching the child, while other requests
are served.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.daemons import Daemon
from tests.integration.test_faults_fake import alive, chat, crashes, fake_daemon, ps_entry, ref, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

POISON = "POISON-PILL"
WORDS = " ".join(f"w{i}" for i in range(40))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp: Path = tmp_path_factory.mktemp("poison")
    per_model = {ref("tiny"): {"FAKE_CRASH_ON": POISON, "FAKE_TOKEN_DELAY": "0.02", "FAKE_REPLY": WORDS}}
    env = {"FAKE_PER_MODEL": json.dumps(per_model), "LLMMAN_RESTART_BACKOFF": "100ms",
           "LLMMAN_SHUTDOWN_GRACE": "5s"}  # fmt: skip
    d = fake_daemon(tmp, env, ("tiny",))
    yield d
    if d.process.poll() is None:
        d.stop(signal.SIGTERM)


def poison(stream: bool = False) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": POISON}], "stream": stream}


def poisoned(d: Daemon) -> int:
    """How many children the poison reached (each says so on stderr, in the model's log, as it dies)."""
    return (d.home.parent / "logs" / "docker.io_ai_tiny_latest.log").read_text().count("(FAKE_CRASH_ON)")


def test_a_poison_request_is_never_replayed_and_is_refused_after_two_crashes(daemon: Daemon) -> None:
    with daemon.client(timeout=60) as client:
        assert client.post("/api/chat", json={"model": "tiny"}).json()["done_reason"] == "load"
        first = ps_entry(daemon, "tiny")
        assert first is not None

        # 1st: sent once, the child dies, the client gets a 500 in its dialect at once, no replay.
        resp = client.post("/v1/chat/completions", json=poison())
        assert resp.status_code == 500, resp.text
        assert "not sent again" in resp.json()["error"]["message"]
        wait_until(lambda: crashes(daemon, "tiny") >= 1, "the crash to show in /api/ps")
        assert not alive(first["pid"])
        # A normal request loads the model again; every child started before the 500 is long gone.
        assert client.post("/api/chat", json=chat("tiny", stream=False)).status_code == 200
        assert poisoned(daemon) == 1  # no replay: the poison reached one child
        assert crashes(daemon, "tiny") == 1

        # 2nd, the same bytes again: a new crash (unavoidable: one crash may be a coincidence), strike two.
        resp = client.post("/v1/chat/completions", json=poison())
        assert resp.status_code == 500, resp.text
        wait_until(lambda: crashes(daemon, "tiny") >= 2, "the second crash")

        # A stream of someone else runs while the same poison comes a third time: refused before the
        # child, with Retry-After; the stream and the child are untouched.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            other = pool.submit(lambda: httpx.post(daemon.url + "/api/chat", timeout=60,
                                                   json=chat("tiny", stream=False)))  # fmt: skip
            wait_until(lambda: (e := ps_entry(daemon, "tiny")) is not None
                       and e["processor"] == "llama-server", "the model to be back")  # fmt: skip
            entry = ps_entry(daemon, "tiny")
            assert entry is not None
            refused = client.post("/v1/chat/completions", json=poison())
            assert refused.status_code == 503, refused.text
            assert int(refused.headers["Retry-After"]) >= 1
            assert refused.json()["error"]["code"] == "request_crashed_model"
            assert "is not sent again" in refused.json()["error"]["message"]
            answer = other.result(timeout=60)
        assert answer.status_code == 200 and answer.json()["message"]["content"] == WORDS
        after = ps_entry(daemon, "tiny")
        assert after is not None and after["pid"] == entry["pid"] and alive(entry["pid"])
        assert crashes(daemon, "tiny") == 2 and poisoned(daemon) == 2
        assert "in flight for 2 crashes in a row" in daemon.log_text()
        assert not [p for p in daemon.children() if alive(p.pid) and p.pid != entry["pid"]]
