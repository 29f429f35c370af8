"""The operator's routes on a real ``llmman serve`` whose llama-server is the fake (fixed behaviour, no
model):
``/health``, ``/metrics`` parsed with prometheus_client's parser (the scheduler's gauges show the loaded
model, the wrapped launcher counted its load, the child's own ``/metrics`` is folded in), the request log's
file in the data dir with ``/llmman/requests`` and ``/llmman/stats`` answering, a request log that cannot be
written leaving inference working, and a clean shutdown."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import Daemon, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TINY = "docker.io/ai/tiny:latest"


def fake_daemon(tmp: Path, env: dict[str, str] | None = None) -> Daemon:
    """A daemon over a store holding ``tiny``, the fake as its llama-server."""
    make_store(tmp, ("tiny",))
    (tmp / "bin").mkdir()
    binary = make_fake_binary(tmp / "bin")
    return start_daemon(tmp, extra_env={"LLMMAN_LLAMA_SERVER": str(binary), "LLMMAN_NODE_NAME": "spark",
                                        **(env or {})})


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = fake_daemon(tmp_path)
    yield d
    if d.process.poll() is None:
        d.stop(signal.SIGTERM)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_health_metrics_and_the_request_log_routes(daemon: Daemon, tmp_path: Path) -> None:
    with daemon.client(timeout=60) as client:
        r = client.get("/health")
        assert (r.status_code, r.json()) == (200, {"status": "ok"})
        before = samples(client.get("/metrics").text)
        assert before["llmman_memory_planned_bytes", frozenset({("node", "spark")})] == 0
        assert not [k for k in before if k[0] == "llmman_model_loaded"]

        r = client.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False})
        assert r.status_code == 200, r.text
        r = client.get("/metrics")
        assert r.status_code == 200
        got = samples(r.text)
        per_model = {("model", TINY), ("kind", "chat"), ("node", "spark")}
        assert got["llmman_model_loaded", frozenset(per_model | {("state", "ready")})] == 1
        assert got["llmman_in_flight", frozenset(per_model)] == 0
        assert got["llmman_model_memory_bytes", frozenset(per_model)] > 0
        assert got["llmman_memory_used_bytes", frozenset({("node", "spark")})] > 0  # the child's RSS
        assert got["llmman_loads_total", frozenset({("model", TINY), ("outcome", "ok")})] == 1
        assert got["llmman_load_seconds_count", frozenset({("model", TINY)})] == 1
        assert got["llamacpp:n_decode_total", frozenset({("model", TINY), ("kind", "chat")})] == 1

        assert (tmp_path / "requests.db").is_file()  # <data_dir>/requests.db, created by the writer
        r = client.get("/llmman/requests", params={"limit": 10})
        assert r.status_code == 200 and isinstance(r.json()["requests"], list)
        r = client.get("/llmman/stats", params={"window": "15m"})
        assert r.status_code == 200
        assert r.json()["window"] == 900 and isinstance(r.json()["stats"], list)
        assert client.get("/llmman/stats", params={"window": "soon"}).status_code == 400
    assert daemon.stop(signal.SIGTERM) == 0
    assert "Traceback" not in daemon.log_text()


def test_a_request_log_that_cannot_be_written_leaves_inference_working(tmp_path: Path) -> None:
    (tmp_path / "requests.db").mkdir()  # a folder where the database should be: it cannot be opened
    d = fake_daemon(tmp_path)
    try:
        with d.client(timeout=60) as client:
            r = client.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False})
            assert r.status_code == 200, r.text
            assert client.get("/health").status_code == 200
            assert client.get("/llmman/requests").json() == {"requests": []}
            rows = samples(client.get("/metrics").text)
            assert ("llmman_requestlog_rows_total", frozenset({("outcome", "written")})) in rows
    finally:
        assert d.stop(signal.SIGTERM) == 0
    log = d.log_text()
    assert "request log: cannot open" in log and "Traceback" not in log


def test_a_description_is_not_a_model_request(daemon: Daemon) -> None:
    """/api/show goes through the pipeline but asks nothing of the model: no request-log row, no request
    counted, so a model's stats (requests, latency percentiles) are its real requests only."""
    with daemon.client(timeout=60) as client:
        assert client.post("/api/show", json={"model": "tiny"}).status_code == 200
        r = client.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False})
        assert r.status_code == 200, r.text
        rows: list[dict[str, object]] = []
        deadline = time.monotonic() + 30
        while not rows and time.monotonic() < deadline:  # the writer batches: wait for the generate's row
            rows = client.get("/llmman/requests", params={"limit": 10}).json()["requests"]
        assert [row["route"] for row in rows] == ["/api/generate"]
        got = samples(client.get("/metrics").text)
        routes = {dict(labels)["route"] for name, labels in got if name == "llmman_requests_total"}
        assert routes == {"/api/generate"}
