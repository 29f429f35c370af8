"""Fault catalogue: SIGTERM and SIGKILL of the daemon under load (issue 13 item 10), against real
``llmman serve`` daemons over the fake llama-server.

SIGTERM with 8 streams running, 4 short (they finish inside the shutdown grace) and 4 long (cut at
its end), on four streamed routes, plus two non-streamed answers and one request waiting for a load.
Before the fix the long ones were torn chunked bodies with no in-band error; now each ends with its
dialect's error frame (a non-streamed one, or one still waiting, with a 503 in its dialect), the
daemon exits 0 and no llama-server is left.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.daemons import Daemon
from tests.integration.test_faults_fake import alive, fake_daemon, ps_entry, ref, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SHORT = " ".join(f"s{i}" for i in range(50))  # 2.5 s at 0.05 s a token
LONG = " ".join(f"l{i}" for i in range(2000))  # 100 s


def body(route: str, name: str, stream: bool) -> dict[str, Any]:
    if route in ("/api/generate", "/v1/completions"):
        return {"model": name, "prompt": "hi", "stream": stream}
    return {"model": name, "messages": [{"role": "user", "content": "hi"}], "stream": stream}


def ending(route: str, raw: bytes) -> str:
    """``done``, ``error`` (an in-band error frame last) or ``torn`` for a streamed answer's bytes."""
    text = raw.decode("utf-8", errors="replace").strip()
    if route.startswith("/api/"):
        last = json.loads(text.splitlines()[-1]) if text else {}
        return "done" if last.get("done") else "error" if set(last) == {"error"} else "torn"
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    if events and events[-1] == "[DONE]":
        return "done"
    try:
        return "error" if events and "error" in json.loads(events[-1]) else "torn"
    except ValueError:
        return "torn"


def test_sigterm_under_load_cuts_what_is_left_with_an_error_frame(tmp_path: Path) -> None:
    per_model = {ref("short"): {"FAKE_TOKEN_DELAY": "0.05", "FAKE_REPLY": SHORT},
                 ref("long"): {"FAKE_TOKEN_DELAY": "0.05", "FAKE_REPLY": LONG},
                 ref("gated"): {"FAKE_LOAD_GATE": str(tmp_path / "never")}}  # fmt: skip
    d = fake_daemon(tmp_path, {"FAKE_PER_MODEL": json.dumps(per_model), "LLMMAN_SHUTDOWN_GRACE": "4s",
                               "LLMMAN_NUM_PARALLEL": "8"}, ("short", "long", "gated"))  # fmt: skip
    try:
        for name in ("short", "long"):
            assert httpx.post(d.url + "/api/generate", json={"model": name}, timeout=30).status_code == 200
        pids = [e["pid"] for e in (ps_entry(d, "short"), ps_entry(d, "long")) if e is not None]
        assert len(pids) == 2
        routes = ["/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions"]
        streams = [(route, name) for name in ("short", "long") for route in routes]
        started = threading.Barrier(len(streams) + 1, timeout=60)

        def run(route: str, name: str) -> tuple[str, str]:
            raw = b""
            try:
                with httpx.stream("POST", d.url + route, json=body(route, name, True), timeout=60) as resp:
                    assert resp.status_code == 200
                    pieces = resp.iter_raw()
                    raw += next(pieces)
                    started.wait()
                    for piece in pieces:
                        raw += piece
            except httpx.TransportError:
                return name, "torn"
            return name, ending(route, raw)

        def plain(route: str) -> httpx.Response:
            return httpx.post(d.url + route, json=body(route, "long", False), timeout=60)

        with concurrent.futures.ThreadPoolExecutor(len(streams) + 3) as pool:
            loading = pool.submit(lambda: httpx.post(d.url + "/v1/chat/completions", timeout=60,
                                                     json=body("/v1/chat/completions", "gated", False)))
            wait_until(lambda: (e := ps_entry(d, "gated")) is not None
                       and e["processor"] == "llama-server (loading)", "gated to be loading",
                       timeout=60)  # fmt: skip
            futures = [pool.submit(run, route, name) for route, name in streams]
            non_streamed = [pool.submit(plain, r) for r in ("/api/chat", "/v1/chat/completions")]
            started.wait()
            wait_until(lambda: all(httpx.get(f"http://127.0.0.1:{_port(pid)}/fake/stats", timeout=5)
                                   .json()["active"] >= n for pid, n in zip(pids, (4, 6), strict=True)),
                       "every answer to be generating", timeout=60)  # fmt: skip
            d.process.send_signal(signal.SIGTERM)
            results = [f.result(timeout=60) for f in futures]
            answers = [f.result(timeout=60) for f in [*non_streamed, loading]]
        assert d.process.wait(timeout=60) == 0
        assert [end for name, end in results if name == "short"] == ["done"] * 4
        assert [end for name, end in results if name == "long"] == ["error"] * 4, results
        for answer in answers:
            assert answer.status_code == 503, answer.text
            error = answer.json()["error"]
            message = error if isinstance(error, str) else error["message"]
            assert "shutting down" in message
        assert "cut 7 answer(s) still running" in d.log_text()
        assert "Traceback" not in d.log_text()
        assert not any(alive(pid) for pid in pids)
    finally:
        if d.process.poll() is None:
            d.process.kill()


def _port(pid: int) -> str:
    import psutil

    argv = psutil.Process(pid).cmdline()
    return argv[argv.index("--port") + 1]


def test_sigkill_of_the_daemon_under_load_leaves_no_child(tmp_path: Path) -> None:
    """SIGKILL cannot drain: the clients see their connection drop, and every llama-server dies with
    the daemon (runner.orphans: PR_SET_PDEATHSIG), none left behind."""
    per_model = {ref("long"): {"FAKE_TOKEN_DELAY": "0.05", "FAKE_REPLY": LONG}}
    d: Daemon = fake_daemon(tmp_path, {"FAKE_PER_MODEL": json.dumps(per_model), "LLMMAN_NUM_PARALLEL": "4"},
                            ("long",))  # fmt: skip
    try:
        started = threading.Barrier(5, timeout=60)

        def run() -> str:
            try:
                with httpx.stream("POST", d.url + "/api/chat", json=body("/api/chat", "long", True),
                                  timeout=60) as resp:  # fmt: skip
                    pieces = resp.iter_raw()
                    next(pieces)
                    started.wait()
                    for _ in pieces:
                        pass
            except httpx.TransportError:
                return "dropped"
            return "finished"

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(run) for _ in range(4)]
            started.wait()
            entry = ps_entry(d, "long")
            assert entry is not None
            pid = entry["pid"]
            d.process.kill()
            assert [f.result(timeout=60) for f in futures] == ["dropped"] * 4
        d.process.wait(timeout=30)
        wait_until(lambda: not alive(pid), "the child to die with its daemon")
    finally:
        if d.process.poll() is None:
            d.process.kill()
