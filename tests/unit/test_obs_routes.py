"""The operator's routes in process (tests/fakes/inprocess.py: the real app, scheduler and fake children):
``/health``, ``/metrics`` (with the scrape key), ``/llmman/requests`` and ``/llmman/stats`` over a real
request log, and the query parameters they refuse."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.fakes.inprocess import InProcessApp

from llmman.api.app import build_app
from llmman.api.services import Services
from llmman.daemon import make_launcher
from llmman.gateway import Gateway
from llmman.obs.observer import Observer
from llmman.obs.requestlog import RequestRow
from llmman.sched.scheduler import Scheduler

TINY = "docker.io/ai/tiny:latest"


class ObservedApp(InProcessApp):
    """:class:`InProcessApp` with the daemon's observer (a real request log in its data dir, metrics
    watching its scheduler, the launcher counting loads), as llmman.daemon builds it."""

    async def _setup(self) -> None:
        settings = self.settings
        self.obs = Observer.of(settings)
        self.scheduler = Scheduler(
            self.obs.launcher(make_launcher(settings, settings.llama_server, dict(self.env))),
            default_keep_alive=settings.keep_alive, stop_grace=5.0)
        self.obs.watch(self.scheduler)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                              auto_decompress=False)
        gateway = Gateway(self.store, self.scheduler, self._session, context_length=settings.context_length,
                          aliases=settings.aliases)
        self.services = Services(settings=settings, store=self.store, scheduler=self.scheduler,
                                 gateway=gateway, obs=self.obs.start())
        transport = httpx.ASGITransport(app=build_app(self.services), raise_app_exceptions=False)
        self._client = httpx.AsyncClient(transport=transport, base_url="http://llmman.localhost", timeout=60)

    async def _teardown(self) -> None:
        await super()._teardown()
        self.obs.close()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[ObservedApp]:
    with ObservedApp(tmp_path, env={"LLMMAN_NODE_NAME": "spark"}) as a:
        yield a


def metric_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_health(app: ObservedApp) -> None:
    r = app.request("GET", "/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    assert app.request("HEAD", "/health").status_code == 200
    index = app.store.root / "index.json"
    good = index.read_bytes()
    index.write_text("{not json")
    r = app.request("GET", "/health")
    assert r.status_code == 503 and r.json()["status"] == "store unreadable"
    index.write_bytes(good)
    assert app.request("GET", "/health").status_code == 200
    app.services.obs.health.stop()
    r = app.request("GET", "/health")
    assert (r.status_code, r.json()) == (503, {"status": "shutting down"})


def test_metrics_show_a_loaded_model_and_its_childs_own_metrics(app: ObservedApp) -> None:
    r = app.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False})
    assert r.status_code == 200, r.text
    r = app.request("GET", "/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    got = metric_samples(r.text)
    per_model = {("model", TINY), ("kind", "chat"), ("node", "spark")}
    assert got["llmman_model_loaded", frozenset(per_model | {("state", "ready")})] == 1
    assert got["llmman_loads_total", frozenset({("model", TINY), ("outcome", "ok")})] == 1
    assert got["llmman_in_flight", frozenset(per_model)] == 0
    # the fake llama-server's own /metrics (it runs with --metrics), labelled with the model
    assert got["llamacpp:n_decode_total", frozenset({("model", TINY), ("kind", "chat")})] == 1


def test_requests_and_stats_read_the_log(app: ObservedApp) -> None:
    now = time.time()
    for i in range(3):
        app.services.obs.request_done(RequestRow(
            time=now - i, node="spark", route="/api/chat", dialect="ollama", model=TINY, status=200,
            duration=1.0, prompt_tokens=4, completion_tokens=10, ttft=0.5, client="127.0.0.1"))
    app.services.obs.request_done(RequestRow(
        time=now - 7200, node="peer", route="/v1/chat/completions", dialect="openai", model=TINY, status=503,
        duration=0.1, error="busy", kind="forwarded"))
    assert app.services.obs.requests.flush()
    rows = app.request("GET", "/llmman/requests").json()["requests"]
    assert [r["node"] for r in rows] == ["spark"] * 3 + ["peer"]
    assert rows[0]["tokens_per_s"] == 20.0
    assert len(app.request("GET", "/llmman/requests?limit=2").json()["requests"]) == 2
    errors = app.request("GET", "/llmman/requests?status=error").json()["requests"]
    assert [r["status"] for r in errors] == [503]
    assert len(app.request("GET", "/llmman/requests?since=1h").json()["requests"]) == 3
    assert len(app.request("GET", f"/llmman/requests?since={now - 0.5}").json()["requests"]) == 1
    assert app.request("GET", "/llmman/requests?node=peer&model=" + TINY).json()["requests"][0]["kind"] == \
        "forwarded"
    stats = app.request("GET", "/llmman/stats").json()
    assert stats["window"] == 3600
    assert [(s["node"], s["requests"], s["tokens_out"]) for s in stats["stats"]] == [("spark", 3, 30)]
    wide = app.request("GET", "/llmman/stats?window=3h").json()["stats"]
    assert {(s["node"], s["errors"]) for s in wide} == {("spark", 0), ("peer", 1)}
    got = metric_samples(app.request("GET", "/metrics").text)
    labels = {("route", "/api/chat"), ("dialect", "ollama"), ("status", "200"), ("model", TINY),
              ("node", "spark"), ("kind", "local")}
    assert got["llmman_requests_total", frozenset(labels)] == 3
    assert got["llmman_requestlog_rows_total", frozenset({("outcome", "written")})] == 4


@pytest.mark.parametrize("query", ["/llmman/requests?limit=0", "/llmman/requests?limit=abc",
                                   "/llmman/requests?status=teapot", "/llmman/requests?since=yesterday",
                                   "/llmman/stats?window=-1h", "/llmman/stats?window=soon"])
def test_bad_parameters_are_400(app: ObservedApp, query: str) -> None:
    r = app.request("GET", query)
    assert r.status_code == 400
    assert r.json()["error"]


def test_the_scrape_key_opens_metrics_only(tmp_path: Path) -> None:
    env = {"LLMMAN_API_KEYS": "client-key", "LLMMAN_METRICS_KEY": "scrape-key"}
    with ObservedApp(tmp_path, env=env) as app:
        scrape = {"Authorization": "Bearer scrape-key"}
        assert app.request("GET", "/metrics").status_code == 401
        assert app.request("GET", "/metrics", headers=scrape).status_code == 200
        client = {"Authorization": "Bearer client-key"}
        assert app.request("GET", "/metrics", headers=client).status_code == 200
        for path in ("/api/tags", "/llmman/requests", "/llmman/stats", "/llmman/node"):
            assert app.request("GET", path, headers=scrape).status_code == 401, path
            assert app.request("GET", path).status_code == 401, path
        assert app.request("GET", "/health").status_code == 200  # open, like /api/version


def test_metrics_off_is_a_404_in_ollamas_shape_and_counts_nothing(tmp_path: Path) -> None:
    with ObservedApp(tmp_path, env={"LLMMAN_METRICS": "off"}) as app:
        r = app.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False})
        assert r.status_code == 200, r.text
        r = app.post("/v1/chat/completions", json={"model": "tiny", "stream": True,
                                                   "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and "[DONE]" in r.text
        r = app.request("GET", "/metrics")
        assert r.status_code == 404
        assert list(r.json()) == ["error"] and "metrics are off" in r.json()["error"]
        metrics = app.services.obs.metrics
        assert metrics._by_request == {} and not metrics._known  # nothing was touched per request
        assert app.services.obs.requests.flush()  # the request log is its own switch: still on
        rows = app.request("GET", "/llmman/requests").json()["requests"]
        assert sorted(r["route"] for r in rows) == ["/api/generate", "/v1/chat/completions"]


#: A streamed request on each dialect for the model ``tiny``.
STREAMS = [("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
           ("/api/generate", {"prompt": "hi", "stream": True}),
           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
           ("/v1/completions", {"prompt": "hi", "stream": True}),
           ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                             "stream": True}),
           ("/v1/responses", {"input": "hi", "stream": True})]


def test_with_both_off_an_answer_goes_out_unwatched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import llmman.api.observed

    def no_sample() -> None:
        raise AssertionError("the answer was watched")

    monkeypatch.setattr(llmman.api.observed, "AnswerSample", no_sample)
    with ObservedApp(tmp_path, env={"LLMMAN_METRICS": "off", "LLMMAN_LOG_REQUESTS": "off"}) as app:
        assert not app.services.obs.active
        for path, body in STREAMS:
            r = app.post(path, json={"model": "tiny", **body})
            assert r.status_code == 200, (path, r.text)
            assert "Hello" in r.text, path  # the fake's answer came through
        assert app.request("GET", "/metrics").status_code == 404
        assert app.request("GET", "/llmman/requests").json() == {"requests": []}
    assert not (tmp_path / "requests.db").exists()


def test_made_up_model_names_add_no_series_on_any_dialect(app: ObservedApp) -> None:
    for i in range(50):
        path, body = STREAMS[i % len(STREAMS)]
        r = app.post(path, json={"model": f"made-up-{i}", **body})
        assert r.status_code == 404, (path, r.text)
    r = app.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False})
    assert r.status_code == 200
    got = metric_samples(app.request("GET", "/metrics").text)
    requests = [dict(labels) for (name, labels) in got if name == "llmman_requests_total"]
    assert {(r["route"], r["model"]) for r in requests if r["status"] == "404"} == \
        {(path, "(unknown)") for path, _ in STREAMS}
    missing = [r for r in requests if r["status"] == "404"]
    assert sum(got["llmman_requests_total", frozenset(r.items())] for r in missing) == 50
    assert {r["model"] for r in requests if r["status"] == "200"} == {TINY}
    models = {dict(labels).get("model") for (name, labels) in got if name.startswith("llmman_")}
    assert not [m for m in models if m and "made-up" in m]  # in no family at all
    assert app.services.obs.requests.flush()  # the request log keeps the names the clients sent
    logged = {r["model"] for r in app.request("GET", "/llmman/requests?limit=100").json()["requests"]}
    assert {f"docker.io/ai/made-up-{i}:latest" for i in range(50)} <= logged
