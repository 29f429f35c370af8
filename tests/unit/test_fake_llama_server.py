"""The fake llama-server behaves like the real one where other tests rely on it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "fake_llama_server.py"
REPLY = "Hello from the fake llama-server."

pytestmark = pytest.mark.timeout(30)


@dataclass
class Fake:
    proc: subprocess.Popen[str]
    url: str
    lines: list[str]


@contextmanager
def run_fake(env: dict[str, str] | None = None, *args: str, until: str = "listening on") -> Iterator[Fake]:
    """Start the fake on a free port and read its stderr until a line containing ``until`` (or EOF)."""
    argv = [sys.executable, str(FAKE), "-m", "m.gguf", "--host", "127.0.0.1", "--port", "0", *args]
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}) as proc:
        lines: list[str] = []
        port = 0
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line.rstrip("\n"))
                if match := re.search(r"port: (\d+)", line):
                    port = int(match.group(1))
                if until in line:
                    break
            yield Fake(proc, f"http://127.0.0.1:{port}", lines)
        finally:
            proc.kill()


def sse_events(text: str) -> list[str]:
    return [block.removeprefix("data: ") for block in text.split("\n\n") if block]


def test_loading_answers_503_in_llama_server_shape() -> None:
    with run_fake({"FAKE_LOAD_DELAY": "60"}, until="loading model") as fake:
        health = httpx.get(fake.url + "/health")
        chat = httpx.post(fake.url + "/v1/chat/completions", json={"messages": []})
    loading = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    assert (health.status_code, health.json()) == (503, loading)
    assert (chat.status_code, chat.json()) == (503, loading)


def test_ready_endpoints() -> None:
    args = ("-a", "smol", "-c", "8192", "-np", "2", "--no-kv-unified", "--metrics", "--unknown-flag")
    with run_fake(None, *args) as fake:
        assert any("main: model loaded" in line for line in fake.lines)
        health = httpx.get(fake.url + "/health")
        props = httpx.get(fake.url + "/props").json()
        models = httpx.get(fake.url + "/v1/models").json()
        metrics = httpx.get(fake.url + "/metrics")
        argv = httpx.get(fake.url + "/fake/argv").json()
    assert (health.status_code, health.json(), health.headers["server"]) == (
        200,
        {"status": "ok"},
        "llama.cpp",
    )
    assert props["default_generation_settings"]["n_ctx"] == 4096
    assert props["total_slots"] == 2
    assert models["data"][0]["id"] == "smol"
    assert models["data"][0]["meta"]["n_ctx"] == 4096
    assert "llamacpp:" in metrics.text
    assert argv[-1] == "--unknown-flag"


def test_streaming_chat_is_shaped_like_llama_server() -> None:
    body = {"messages": [{"role": "user", "content": "hi there"}], "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with run_fake() as fake:
        resp = httpx.post(fake.url + "/v1/chat/completions", json=body)
    assert resp.headers["content-type"] == "text/event-stream"
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    chunks: list[dict[str, Any]] = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    tokens = [c["choices"][0]["delta"]["content"] for c in chunks[1:-2]]
    assert "".join(tokens) == REPLY
    assert len(tokens) == len(REPLY.split())
    finish = chunks[-2]["choices"][0]
    assert (finish["finish_reason"], finish["delta"]) == ("stop", {})
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == len(tokens)
    assert usage_chunk["timings"]["predicted_n"] == len(tokens)
    assert {"prompt_n", "prompt_ms", "predicted_ms", "cache_n"} <= usage_chunk["timings"].keys()
    assert [c for c in chunks if "timings" in c] == [usage_chunk]


def test_streaming_without_usage_puts_timings_on_the_finish_chunk() -> None:
    with run_fake() as fake:
        resp = httpx.post(fake.url + "/v1/chat/completions", json={"messages": [], "stream": True})
    chunks = [json.loads(e) for e in sse_events(resp.text)[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "timings" in chunks[-1] and "usage" not in chunks[-1]


def test_non_streaming_chat_honours_max_tokens() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with run_fake({"FAKE_REPLY": "one two three four"}) as fake:
        answer = httpx.post(fake.url + "/v1/chat/completions", json=body).json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "one two"}
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 2
    assert answer["timings"]["predicted_n"] == 2


def test_text_completions_stream() -> None:
    with run_fake() as fake:
        resp = httpx.post(
            fake.url + "/v1/completions", json={"prompt": "say", "stream": True, "max_tokens": 1}
        )
    chunks = [json.loads(e) for e in sse_events(resp.text)[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == ["Hello", ""]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_malformed_json_is_a_400() -> None:
    with run_fake() as fake:
        resp = httpx.post(fake.url + "/v1/chat/completions", content=b"{not json")
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert resp.json()["error"]["code"] == 400


def test_exit_on_load_prints_reason_and_exits_with_code() -> None:
    with run_fake({"FAKE_EXIT_ON_LOAD": "7"}, until="exiting due to model loading error") as fake:
        assert fake.proc.wait() == 7
    assert any("error loading model" in line for line in fake.lines)


def test_crash_after_tokens_kills_the_process_mid_stream() -> None:
    with run_fake({"FAKE_CRASH_AFTER_TOKENS": "2"}) as fake:
        with pytest.raises(httpx.HTTPError):
            httpx.post(fake.url + "/v1/chat/completions", json={"messages": [], "stream": True})
        assert fake.proc.wait() == -signal.SIGKILL


def test_sigterm_exits_cleanly() -> None:
    with run_fake() as fake:
        fake.proc.send_signal(signal.SIGTERM)
        assert fake.proc.wait() == 0


def test_port_in_use_says_couldnt_bind() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        argv = [sys.executable, str(FAKE), "-m", "m.gguf", "--port", port]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "couldn't bind HTTP server socket" in done.stderr


def test_env_endpoint() -> None:
    with run_fake({"MARKER": "42"}) as fake:
        env = httpx.get(fake.url + "/fake/env").json()
    assert env["MARKER"] == "42"


@pytest.mark.parametrize(("env", "waits"), [({"FAKE_SLOTS": "1"}, True), ({}, False)])
def test_fake_slots_make_a_generation_beyond_np_wait_for_a_slot(env: dict[str, str], waits: bool) -> None:
    """FAKE_SLOTS=1 (fixed capacity): with both ``-np 2`` slots busy, a one-token stream ends only after one
    of the two long ones; without it, it runs at once beside them."""
    env = {**env, "FAKE_TOKEN_DELAY": "0.05", "FAKE_REPLY": " ".join(["w"] * 40)}
    with run_fake(env, "-np", "2") as fake, ThreadPoolExecutor(2) as pool:
        url = fake.url + "/v1/chat/completions"
        long = [pool.submit(httpx.post, url, json={"messages": [], "stream": True}, timeout=60)
                for _ in range(2)]
        deadline = time.monotonic() + 20
        while httpx.get(fake.url + "/fake/stats").json()["active"] < 2:
            assert time.monotonic() < deadline, "the two long streams never ran"
            time.sleep(0.01)
        short = httpx.post(url, json={"messages": [], "stream": True, "max_tokens": 1}, timeout=60)
        completed = httpx.get(fake.url + "/fake/stats").json()["completed"]
        assert [f.result().status_code for f in long] == [200, 200]
    assert short.status_code == 200
    assert (completed >= 2) is waits  # the short one plus a long one that had to end first
