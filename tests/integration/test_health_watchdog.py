"""The /health watchdog (runner.health) against a real ``llmman serve`` over the fake llama-server:
a child stopped with SIGSTOP mid-stream is found hung, killed and restarted, its client gets an error;
a child that is busy streaming slowly but still answers /health is left alone, and so is one that
leaves /health unanswered while it streams (llama-server under 64 streams, its HTTP threads all busy:
``FAKE_HEALTH_MUTE``), since its tokens are progress."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import psutil
import pytest

from tests.integration.daemons import Daemon
from tests.integration.test_faults_fake import (
    alive,
    chat,
    crashes,
    fake_daemon,
    ps,
    ps_entry,
    ref,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WORDS = " ".join(f"w{i}" for i in range(60))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose watchdog probes every 0.2 s; ``drip`` streams a token every 0.05 s (3 s in all)."""
    tmp = tmp_path_factory.mktemp("watchdog")
    per_model = {ref("drip"): {"FAKE_TOKEN_DELAY": "0.05", "FAKE_REPLY": WORDS},
                 ref("mute"): {"FAKE_TOKEN_DELAY": "0.05", "FAKE_REPLY": WORDS, "FAKE_HEALTH_MUTE": "1"}}
    env = {"FAKE_PER_MODEL": json.dumps(per_model), "LLMMAN_HEALTH_INTERVAL": "200ms",
           "LLMMAN_SHUTDOWN_GRACE": "5s"}  # fmt: skip
    d = fake_daemon(tmp, env, ("drip", "mute"))
    yield d
    if d.process.poll() is None:
        d.stop(signal.SIGTERM)


def test_busy_but_healthy_child_is_not_killed(daemon: Daemon) -> None:
    """A 3 s stream spans about 15 probes: every one is answered, so the stream completes on one pid."""
    with daemon.client(timeout=60) as client:
        with client.stream("POST", "/api/chat", json=chat("drip")) as resp:
            assert resp.status_code == 200
            lines = [json.loads(line) for line in resp.iter_lines()]
    assert lines[-1].get("done") is True, lines[-1]
    assert "".join(o["message"]["content"] for o in lines[:-1]) == WORDS
    entry = ps_entry(daemon, "drip")
    assert entry is not None and alive(entry["pid"]) and crashes(daemon, "drip") == 0


def test_sigstopped_child_is_killed_and_its_stream_fails(daemon: Daemon) -> None:
    """SIGSTOP mid-stream: after 3 unanswered probes the group is SIGKILLed; the client gets an error."""
    with daemon.client(timeout=60) as client:
        assert client.post("/api/chat", json={"model": "drip"}).status_code == 200
        entry = ps_entry(daemon, "drip")
        assert entry is not None
        pid = entry["pid"]
        child = psutil.Process(pid)
        with client.stream("POST", "/api/chat", json=chat("drip")) as resp:
            assert resp.status_code == 200
            lines_iter = resp.iter_lines()
            first = json.loads(next(lines_iter))
            assert "message" in first
            child.send_signal(signal.SIGSTOP)  # hung: the process and its socket stay, nothing answers
            rest = [json.loads(line) for line in lines_iter]
    assert rest and set(rest[-1]) == {"error"}, rest[-1:]
    assert not any(o.get("done") for o in rest)
    wait_until(lambda: not alive(pid), "the hung child to be killed")
    # Forgotten (or restarted, had the scheduler still counted it busy): never the hung pid again, and
    # /api/ps says why it died.
    wait_until(lambda: "hung (no /health answer for" in str(ps(daemon)), "the cause to show in /api/ps")
    entry = ps_entry(daemon, "drip")
    assert entry is None or entry["pid"] != pid
    assert "is hung (no /health answer" in daemon.log_text()
    with daemon.client(timeout=60) as client:
        again = client.post("/api/chat", json=chat("drip", stream=False, options={"num_predict": 2}))
    assert again.status_code == 200, again.text
    assert again.json()["message"]["content"] == "w0 w1"


def test_child_streaming_without_answering_health_is_not_killed(daemon: Daemon) -> None:
    """Issue 13 item 2: /health stays unanswered for the whole 3 s stream (15 probe intervals, 5 times
    the 3 failures that used to mean hung); the tokens it relays prove it alive. Then /health answers
    again and the child stays."""
    with daemon.client(timeout=60) as client:
        assert client.post("/api/chat", json={"model": "mute"}).status_code == 200
        entry = ps_entry(daemon, "mute")
        assert entry is not None
        pid = entry["pid"]
        with client.stream("POST", "/v1/chat/completions", json=chat("mute", stream=True)) as resp:
            assert resp.status_code == 200
            raw = b"".join(resp.iter_raw())
        assert raw.rstrip().endswith(b"data: [DONE]"), raw[-300:]
        with client.stream("POST", "/api/chat", json=chat("mute")) as resp:
            lines = [json.loads(line) for line in resp.iter_lines()]
    assert lines[-1].get("done") is True, lines[-1]
    assert "".join(o["message"]["content"] for o in lines[:-1]) == WORDS
    entry = ps_entry(daemon, "mute")
    assert entry is not None and entry["pid"] == pid and alive(pid)
    assert crashes(daemon, "mute") == 0
    assert f"(pid {pid}) is hung" not in daemon.log_text()
