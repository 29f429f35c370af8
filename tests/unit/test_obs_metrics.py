"""The metrics (llmman.obs.metrics, llmman.obs.children) read back with prometheus_client's own text parser:
request events, the scheduler's gauges at scrape time, loads/crashes/restarts counted by the wrapped
launcher, children's /metrics folded in with a model label, and each daemon's registry its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from tests.fakes.runner import StubRunner

from llmman.errors import RunnerError
from llmman.obs.children import Child, Children, observed, scrape
from llmman.obs.metrics import OTHER, PEER_LABELS_MAX, UNKNOWN, Metrics
from llmman.obs.requestlog import RequestLog, RequestRow
from llmman.runner.crash import Cause
from llmman.sched.scheduler import ModelPlan, Runner, Scheduler

MODEL = "docker.io/ai/a:1"


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(metrics: Metrics, extra: list[object] | None = None) -> Samples:
    """Every sample of the exposition: (name, labels) -> value."""
    text = metrics.exposition(extra or []).decode()  # type: ignore[arg-type]
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def value(got: Samples, name: str, **labels: str) -> float | None:
    return got.get((name, frozenset(labels.items())))


def row(**kw: object) -> RequestRow:
    fields: dict[str, object] = dict(time=0.0, node="spark", route="/api/chat", dialect="ollama",
                                     model=MODEL, status=200, duration=2.0, prompt_tokens=7,
                                     completion_tokens=30, ttft=0.5)
    fields.update(kw)
    return RequestRow(**fields)  # type: ignore[arg-type]


def test_request_events_move_their_families_by_exactly_what_was_reported() -> None:
    metrics = Metrics(node="spark")
    metrics.request_done(row())
    metrics.request_done(row())
    metrics.request_done(row(status=404, model="docker.io/ai/none:1", prompt_tokens=None,
                             completion_tokens=None, ttft=None))
    metrics.request_done(row(node="peer", kind="forwarded"))
    got = samples(metrics)
    labels = dict(route="/api/chat", dialect="ollama", status="200", model=MODEL, node="spark", kind="local")
    assert value(got, "llmman_requests_total", **labels) == 2
    assert value(got, "llmman_requests_total", **{**labels, "node": "peer", "kind": "forwarded"}) == 1
    missing = {**labels, "status": "404", "model": UNKNOWN}  # a model this node does not know
    assert value(got, "llmman_requests_total", **missing) == 1
    assert value(got, "llmman_tokens_total", direction="in", model=MODEL, node="spark", kind="local") == 14
    assert value(got, "llmman_tokens_total", direction="out", model=MODEL, node="spark", kind="local") == 60
    mine = dict(model=MODEL, node="spark", kind="local")
    assert value(got, "llmman_time_to_first_token_seconds_count", **mine) == 2
    assert value(got, "llmman_time_to_first_token_seconds_sum", **mine) == 1.0
    assert value(got, "llmman_time_to_first_token_seconds_bucket", **mine, le="0.5") == 2
    assert value(got, "llmman_time_to_first_token_seconds_bucket", **mine, le="0.25") == 0
    assert value(got, "llmman_generation_tokens_per_second_count", **mine) == 2
    assert value(got, "llmman_generation_tokens_per_second_sum", **mine) == 40.0


def test_other_events() -> None:
    metrics = Metrics(node="spark")
    metrics.waited(MODEL, 0.2)
    metrics.evicted(MODEL)
    metrics.forwarded("http://b:1", "ok")
    metrics.forwarded("http://b:1", "failed")
    metrics.hop("10.0.0.2", "ok")
    metrics.pulled("registry", "ok", 1000)
    metrics.pulled("peer", "failed")
    got = samples(metrics)
    assert value(got, "llmman_queue_wait_seconds_count", model=MODEL) == 1
    assert value(got, "llmman_evictions_total", model=MODEL) == 1
    assert value(got, "llmman_forwards_total", peer="http://b:1", outcome="ok") == 1
    assert value(got, "llmman_forwards_total", peer="http://b:1", outcome="failed") == 1
    assert value(got, "llmman_hops_total", peer="10.0.0.2", outcome="ok") == 1
    assert value(got, "llmman_pulls_total", source="registry", outcome="ok") == 1
    assert value(got, "llmman_pulls_total", source="peer", outcome="failed") == 1
    assert value(got, "llmman_pull_bytes_total", source="registry") == 1000


def series(got: Samples, name: str) -> set[frozenset[tuple[str, str]]]:
    return {labels for (n, labels) in got if n == name}


def test_made_up_model_names_add_no_series() -> None:
    metrics = Metrics(node="spark")
    for i in range(50):
        for route, dialect in (("/api/chat", "ollama"), ("/v1/chat/completions", "openai")):
            metrics.request_done(row(route=route, dialect=dialect, status=404,
                                     model=f"docker.io/x/made-up-{i}:1", prompt_tokens=None,
                                     completion_tokens=None, ttft=None))
    got = samples(metrics)
    assert {dict(labels)["model"] for labels in series(got, "llmman_requests_total")} == {UNKNOWN}
    assert len(series(got, "llmman_requests_total")) == 2  # one per route, whatever the names
    assert value(got, "llmman_requests_total", route="/api/chat", dialect="ollama", status="404",
                 model=UNKNOWN, node="spark", kind="local") == 50
    assert len(metrics._by_request) == 2  # the cache of labelled children is bounded too


def test_a_known_models_errors_keep_its_name() -> None:
    metrics = Metrics(node="spark")
    metrics.load_done("docker.io/ai/loaded:1", 1.0, ok=True)  # loaded here: known
    metrics.request_done(row(model="docker.io/ai/loaded:1", status=503))
    metrics.request_done(row(model=MODEL, status=200))  # answered once: known
    metrics.request_done(row(model=MODEL, status=400))
    metrics.request_done(row(model="docker.io/ai/failed-load:1", status=500))  # never loaded nor answered
    got = samples(metrics)
    models = {(dict(labels)["model"], dict(labels)["status"])
              for labels in series(got, "llmman_requests_total")}
    assert models == {("docker.io/ai/loaded:1", "503"), (MODEL, "200"), (MODEL, "400"), (UNKNOWN, "500")}


def test_hop_peers_are_bounded() -> None:
    metrics = Metrics(node="spark")
    for i in range(PEER_LABELS_MAX + 30):
        metrics.hop(f"10.0.{i // 256}.{i % 256}", "ok")
    got = samples(metrics)
    peers = {dict(labels)["peer"] for labels in series(got, "llmman_hops_total")}
    assert len(peers) == PEER_LABELS_MAX + 1 and OTHER in peers
    assert value(got, "llmman_hops_total", peer=OTHER, outcome="ok") == 30


def test_off_counts_nothing_and_exports_nothing(tmp_path: Path) -> None:
    requests = RequestLog(tmp_path / "r.db")
    metrics = Metrics(node="spark", requests=requests, collect=False)
    metrics.request_done(row())
    metrics.waited(MODEL, 0.2)
    metrics.load_done(MODEL, 1.0, ok=True)
    metrics.load_done(MODEL, 1.0, ok=False)
    metrics.evicted(MODEL)
    metrics.crashed(MODEL, "oom")
    metrics.restarted(MODEL)
    metrics.forwarded("http://b:1", "ok")
    metrics.hop("10.0.0.2", "ok")
    metrics.pulled("registry", "ok", 1000)
    metrics.watch(Scheduler(Launcher(), default_keep_alive=300))
    assert samples(metrics) == {}  # no sample at all: not even the request log's or the scheduler's
    assert metrics._by_request == {} and not metrics._known


def test_each_daemon_has_its_own_registry() -> None:
    one, two = Metrics(node="a"), Metrics(node="b")  # a global registry would refuse the second
    one.evicted(MODEL)
    assert value(samples(one), "llmman_evictions_total", model=MODEL) == 1
    assert value(samples(two), "llmman_evictions_total", model=MODEL) is None


def test_a_long_model_name_is_cut() -> None:
    metrics = Metrics(node="a")
    metrics.request_done(row(model="m" * 5000))
    (name,) = {dict(labels)["model"] for (n, labels) in samples(metrics) if n == "llmman_requests_total"}
    assert name == "m" * 200


def test_the_request_logs_writer_is_exported(tmp_path: Path) -> None:
    requests = RequestLog(tmp_path / "r.db", queue_size=1)  # not started: the second row is dropped
    metrics = Metrics(node="a", requests=requests)
    requests.record(row())
    requests.record(row())
    got = samples(metrics)
    assert value(got, "llmman_requestlog_rows_total", outcome="dropped") == 1
    assert value(got, "llmman_requestlog_rows_total", outcome="written") == 0


class Launcher:
    """Starts stub children; ``fail`` makes the next launch fail as llama-server does."""

    def __init__(self) -> None:
        self.started: list[StubRunner] = []
        self.fail = False

    async def __call__(self, plan: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        if self.fail:
            self.fail = False
            error = RunnerError("llama-server exited")
            error.cause = "bad argument"
            raise error
        runner = StubRunner(f"http://127.0.0.1:{9000 + len(self.started)}", 4000 + len(self.started), on_exit)
        self.started.append(runner)
        return runner


def plan(name: str = MODEL) -> ModelPlan:
    return ModelPlan(reference=name, digest="sha256:" + "0" * 64, size=100, n_ctx=2048, n_parallel=2,
                     estimate=1000)


async def test_the_schedulers_state_is_read_at_scrape_time() -> None:
    metrics, children = Metrics(node="spark"), Children()
    launcher = Launcher()
    scheduler = Scheduler(observed(launcher, metrics, children), default_keep_alive=300, capacity=10_000,
                          heal_base=0.001)
    metrics.watch(scheduler)
    try:
        leases = [await scheduler.acquire(plan()) for _ in range(3)]
        got = samples(metrics)
        per_model = dict(model=MODEL, kind="chat", node="spark")
        assert value(got, "llmman_model_loaded", **per_model, state="ready") == 1
        assert value(got, "llmman_model_slots", **per_model) == 2
        assert value(got, "llmman_in_flight", **per_model) == 2
        assert value(got, "llmman_queued", **per_model) == 1
        assert value(got, "llmman_model_memory_bytes", **per_model) == 1000
        assert value(got, "llmman_memory_capacity_bytes", node="spark") == 10_000
        assert value(got, "llmman_memory_planned_bytes", node="spark") == 1000
        assert value(got, "llmman_loads_total", model=MODEL, outcome="ok") == 1
        assert value(got, "llmman_load_seconds_count", model=MODEL) == 1
        assert [c.base_url for c in children.current(scheduler.snapshot())] == [launcher.started[0].base_url]
        for lease in leases:
            lease.release()
        assert value(samples(metrics), "llmman_in_flight", **per_model) == 0

        launcher.started[0].crash(Cause.KILLED)  # dies on its own: forgotten, counted, failure recorded
        got = samples(metrics)
        assert value(got, "llmman_model_loaded", **per_model, state="ready") is None
        assert value(got, "llmman_crashes_total", model=MODEL, cause=Cause.KILLED.value) == 1
        assert value(got, "llmman_model_failures", model=MODEL, cause=Cause.KILLED.value, node="spark") == 1
        assert value(got, "llmman_model_breaker_open", model=MODEL, node="spark") == 0
        assert children.current(scheduler.snapshot()) == []

        (await scheduler.acquire(plan())).release()  # the next request loads it again: a restart
        got = samples(metrics)
        assert value(got, "llmman_restarts_total", model=MODEL) == 1
        assert value(got, "llmman_loads_total", model=MODEL, outcome="ok") == 2
    finally:
        await scheduler.close()


async def test_a_failed_load_is_counted() -> None:
    metrics = Metrics(node="spark")
    launcher = Launcher()
    launcher.fail = True
    scheduler = Scheduler(observed(launcher, metrics, Children()), default_keep_alive=300, heal_base=0.001)
    try:
        with pytest.raises(RunnerError):
            await scheduler.acquire(plan())
        got = samples(metrics)
        assert value(got, "llmman_loads_total", model=MODEL, outcome="failed") == 1
        assert value(got, "llmman_load_seconds_count", model=MODEL) is None
    finally:
        await scheduler.close()


CHILD_TEXT = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {n}
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
"""


@pytest.fixture
async def two_children() -> AsyncIterator[list[Child]]:
    """Two loopback servers answering ``/metrics`` as llama-server does, and one that answers 404."""
    runners, out = [], []
    for n in (5, 7, None):
        async def handler(request: web.Request, n: int | None = n) -> web.Response:
            if n is None:
                return web.Response(status=404)
            return web.Response(text=CHILD_TEXT.format(n=n), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        runners.append(runner)
        out.append(Child(f"docker.io/ai/m{n}:1", "chat", f"http://127.0.0.1:{port}"))
    try:
        yield out
    finally:
        await asyncio.gather(*(r.cleanup() for r in runners))


async def test_the_childrens_metrics_are_folded_in_with_a_model_label(two_children: list[Child]) -> None:
    families = await scrape(two_children)
    got = samples(Metrics(node="spark"), families)  # type: ignore[arg-type]
    assert value(got, "llamacpp:prompt_tokens_total", model="docker.io/ai/m5:1", kind="chat") == 5
    assert value(got, "llamacpp:prompt_tokens_total", model="docker.io/ai/m7:1", kind="chat") == 7
    assert value(got, "llamacpp:requests_processing", model="docker.io/ai/m7:1", kind="chat") == 1
    assert not [k for k in got if dict(k[1]).get("model") == "docker.io/ai/mNone:1"]
    text = Metrics(node="spark").exposition(families).decode()
    assert text.count("# TYPE llamacpp:prompt_tokens_total counter") == 1  # one family over both children


async def test_a_child_that_does_not_answer_is_left_out() -> None:
    assert await scrape([Child("m", "chat", "http://127.0.0.1:1")]) == []
