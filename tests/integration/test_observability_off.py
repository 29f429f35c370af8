"""The observation's off switches on a real ``llmman serve`` with the real llama-server and SmolLM2-135M:
with ``LLMMAN_METRICS=off`` every dialect still streams its answer, ``GET /metrics`` is a 404 in Ollama's
error shape and the request log (its own switch) still has a row per request with the answer's tokens;
with ``LLMMAN_LOG_REQUESTS=off`` as well, inference works and no request log is created at all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import MODEL_NAME, MODEL_REF
from tests.integration.daemons import Daemon, model_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

USER = [{"role": "user", "content": "Say hi."}]
#: A short streamed request on every dialect, each capped at a few tokens.
STREAMS: list[tuple[str, dict[str, Any]]] = [
    ("/api/chat", {"messages": USER, "stream": True, "options": {"num_predict": 4}}),
    ("/api/generate", {"prompt": "Hi", "stream": True, "options": {"num_predict": 4}}),
    ("/v1/chat/completions", {"messages": USER, "stream": True, "max_tokens": 4,
                              "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "Hi", "stream": True, "max_tokens": 4}),
    ("/v1/messages", {"messages": USER, "stream": True, "max_tokens": 4}),
    ("/v1/responses", {"input": "Hi", "stream": True, "max_output_tokens": 4}),
]


def stream_everywhere(d: Daemon) -> None:
    """Each of :data:`STREAMS` answers 200 with a streamed body that ends as its dialect ends."""
    ends = {"/api/chat": '"done":true', "/api/generate": '"done":true',
            "/v1/chat/completions": "[DONE]", "/v1/completions": "[DONE]", "/v1/messages": "message_stop",
            "/v1/responses": "response.completed"}
    with d.client(timeout=120) as client:
        for path, body in STREAMS:
            r = client.post(path, json={"model": MODEL_NAME, **body})
            assert r.status_code == 200, (path, r.text)
            assert ends[path] in r.text.replace(" ", ""), (path, r.text[-300:])


def test_metrics_off_leaves_every_dialect_streaming_and_metrics_404(tmp_path: Path, model_file: Path) -> None:
    with model_daemon(tmp_path, model_file, MODEL_NAME, extra_env={"LLMMAN_METRICS": "off"}) as d:
        stream_everywhere(d)
        with d.client(timeout=30) as client:
            r = client.get("/metrics")
            assert r.status_code == 404
            assert r.headers["content-type"].startswith("application/json")
            assert list(r.json()) == ["error"] and "metrics are off" in r.json()["error"]
            rows: list[dict[str, Any]] = []

            def logged() -> bool:
                rows[:] = client.get("/llmman/requests", params={"limit": 100}).json()["requests"]
                return len(rows) >= len(STREAMS)

            wait_until(logged, "a request-log row per request")
        assert sorted(r["route"] for r in rows) == sorted(path for path, _ in STREAMS)
        assert {r["model"] for r in rows} == {MODEL_REF}
        assert all(r["status"] == 200 and r["completion_tokens"] for r in rows), json.dumps(rows)
        assert "Traceback" not in d.log_text()


def test_both_off_serve_as_before_and_keep_no_log(tmp_path: Path, model_file: Path) -> None:
    env = {"LLMMAN_METRICS": "off", "LLMMAN_LOG_REQUESTS": "off"}
    with model_daemon(tmp_path, model_file, MODEL_NAME, extra_env=env) as d:
        stream_everywhere(d)
        with d.client(timeout=30) as client:
            assert client.get("/metrics").status_code == 404
            assert client.get("/llmman/requests").json() == {"requests": []}
        assert not list(tmp_path.rglob("requests.db"))
        assert "Traceback" not in d.log_text()
