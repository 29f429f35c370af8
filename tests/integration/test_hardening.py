"""Regression tests for bugs found by an adversarial pass over llmman (each failed before its fix).

Every test uses a daemon whose llama-server is the fake (tests/fakes/fake_llama_server.py) over a tiny
synthetic GGUF, or only the store and CLI, so none of them needs the real model.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import Daemon, free_port, start_daemon
from tests.unit.ggufgen import write_gguf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "tiny"


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("attack")
    make_store(tmp, (MODEL,))
    (tmp / "bin").mkdir()
    d = start_daemon(tmp, extra_env={"LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin"))})
    yield d
    if d.process.poll() is None:
        d.stop(signal.SIGTERM)


def _unload(d: Daemon) -> None:
    httpx.post(d.url + "/api/generate", json={"model": MODEL, "keep_alive": 0}, timeout=30)


# Regression: a keep_alive beyond year 9999 ('999999999h') made /api/ps answer 500.
def test_ps_survives_huge_keep_alive(fake: Daemon) -> None:
    try:
        r = httpx.post(
            fake.url + "/api/generate",
            json={"model": MODEL, "prompt": "hi", "stream": False, "keep_alive": "999999999h"},
            timeout=30,
        )
        assert r.status_code == 200
        ps = httpx.get(fake.url + "/api/ps", timeout=10)
        assert ps.status_code == 200, ps.text
    finally:
        _unload(fake)


# Regression: integral floats beyond 64 bits in integer options passed validation, then 500.
@pytest.mark.parametrize("option", [{"num_predict": 1e300}, {"seed": 1e20}])
def test_out_of_range_integer_option_is_400(fake: Daemon, option: dict[str, float]) -> None:
    r = httpx.post(
        fake.url + "/api/generate",
        json={"model": MODEL, "prompt": "hi", "stream": False, "options": option},
        timeout=30,
    )
    assert r.status_code == 400, (r.status_code, r.text)


# Regression: a 500 was re-raised by Starlette, so uvicorn reset the kept-alive connection.
def test_connection_usable_after_a_500(fake: Daemon) -> None:
    failures = 0
    with httpx.Client(base_url=fake.url, timeout=30) as client:
        for _ in range(10):
            r = client.post(
                "/api/generate",
                json={"model": MODEL, "prompt": "x", "stream": False, "options": {"num_predict": 1e300}},
            )
            assert r.status_code >= 400
            try:
                client.get("/api/version")
            except httpx.TransportError:
                failures += 1
    assert failures == 0, f"{failures}/10 follow-up requests on the kept-alive connection failed"


# Regression: a client hanging up mid-body left an 'unhandled error' traceback in the log.
def test_disconnect_during_body_upload_logs_no_traceback(fake: Daemon) -> None:
    host, port = fake.url.removeprefix("http://").split(":")
    before = fake.log_text().count("Traceback")
    head = (
        b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head + b'{"model": "tiny", "mess')
    deadline = time.monotonic() + 3.0  # give the daemon time to notice the disconnect and log
    while time.monotonic() < deadline and fake.log_text().count("Traceback") == before:
        time.sleep(0.05)
    assert fake.log_text().count("Traceback") == before, fake.log_text()[-2000:]


# Regression: /api/copy silently dropped a digest in the destination instead of a 400.
def test_copy_to_digest_destination_is_refused(fake: Daemon) -> None:
    r = httpx.post(
        fake.url + "/api/copy",
        json={"source": MODEL, "destination": "other:tag@sha256:" + "0" * 64},
        timeout=10,
    )
    try:
        assert r.status_code == 400, r.status_code
    finally:
        httpx.request("DELETE", fake.url + "/api/delete", json={"model": "other:tag"}, timeout=10)


# Regression: gc in another process deleted the blobs of an in-flight build.
def test_gc_in_another_process_keeps_in_flight_blobs(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    builder = Store(store_dir)
    builder.build(parse_reference("victim:1"), write_gguf(tmp_path / "v.gguf", extra={"test.nonce": 1}))
    # An in-flight build: its weight blob is written (pinned in this process), the manifest not yet put.
    blob = builder.write_blob([(tmp_path / "v.gguf").read_bytes() + b"new"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_"))}
    # No daemon answers at LLMMAN_HOST, so the CLI works on the store itself (even if one runs on 17434).
    env.update(HOME=str(tmp_path), LLMMAN_MODELS=str(store_dir), LLMMAN_HOST=f"127.0.0.1:{free_port()}")
    done = subprocess.run(
        [sys.executable, "-m", "llmman", "rm", "victim:1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert builder.blob_path(blob).exists(), "another process's gc deleted a blob of an in-flight build"


# Regression: LLMMAN_HOST 'a:b:c' was accepted, then the CLI died with a traceback.
def test_cli_bad_host_is_a_clean_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_"))}
    env.update(HOME=str(tmp_path), LLMMAN_MODELS=str(tmp_path / "store"), LLMMAN_HOST="a:b:c")
    done = subprocess.run(
        [sys.executable, "-m", "llmman", "ps"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
