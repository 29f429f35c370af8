"""Prometheus metrics of one daemon: a registry of its own (never prometheus_client's global one).

Two kinds of figures (names and labels in docs/observability.md):

- **Events** the data path reports through :class:`Metrics`' methods (:meth:`Metrics.request_done`,
  :meth:`Metrics.forwarded`, :meth:`Metrics.load_done`, ...): counters and histograms. The four
  per-request families are plain numbers per label set, updated without a lock by the event loop (their
  only writer) and exported at scrape time (:class:`RequestCollector`): a finished request costs a few
  dictionary and attribute updates, not five locked prometheus_client updates.
- **State** read when scraped, from where it is kept (:class:`SchedulerCollector`: the scheduler's table,
  its failure records and the node's memory; :class:`RequestLogCollector`: the request log's writer), so
  a gauge can never drift from the scheduler's own view.

**Off** (``metrics.collect = false``, :attr:`Metrics.collect`): every event method returns at once, so the
data path touches no metric object, and ``GET /metrics`` answers 404 (llmman.api.metrics_route).

**Bounded series.** No label takes a new value per name a client makes up: the ``model`` of a request
answered 4xx or 5xx is the model's own only when this node knows it (it loaded it, or answered a request
for it with a success), else :data:`UNKNOWN`; the ``peer`` of a hop (a client address, since any client
may send ``x-llmman-hop``) is one of the first :data:`PEER_LABELS_MAX` seen, else :data:`OTHER`. The
routes and dialects are the route table's own (llmman.api.observed wraps the inference routes only, none
with a path parameter); values are cut to :data:`LABEL_MAX` characters.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Iterable, Iterator

import psutil
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from llmman.obs.requestlog import RequestLog, RequestRow
from llmman.sched.gpu import telemetry
from llmman.sched.scheduler import Scheduler
from llmman.sched.table import LoadedSnapshot

LABEL_MAX = 200
UNKNOWN = "(unknown)"  # the model label of an error answer for a model this node does not know
OTHER = "(other)"  # the peer label of hops past PEER_LABELS_MAX distinct addresses
PEER_LABELS_MAX = 64
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
SPEED_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 35.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0, 1000.0,
                 2000.0)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
LOAD_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


def _label(value: str) -> str:
    return value[:LABEL_MAX]


class Metrics:
    """The daemon's metric families and the events that move them.

    Args:
        node: this node's name (``node.name``), the ``node`` label of what this node serves.
        requests: the request log, whose writer's counters are exported; None = none.
        collect: False (``metrics.collect = false``): nothing is counted and nothing is exported.

    The scheduler's gauges come once :meth:`watch` is called (the scheduler is built after its launcher,
    which reports to these metrics).
    """

    def __init__(self, *, node: str, requests: RequestLog | None = None, collect: bool = True) -> None:
        self.node = node
        self.collect = collect
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # The per-request families are plain numbers, exported at scrape time (RequestCollector): the
        # event loop is their only writer, so they need none of prometheus_client's locks per update.
        self._by_request: dict[tuple[str, str, int, str, str, str], int] = {}  # requests by label set
        self._by_model: dict[tuple[str, str, str], _ModelFigures] = {}  # (model, node, kind)
        r.register(RequestCollector(self._by_request, self._by_model))
        self.queue_wait = Histogram("llmman_queue_wait_seconds",
                                    "Seconds a request waited for its model (a load, a free slot).",
                                    ["model"], buckets=WAIT_BUCKETS, registry=r)
        self.loads = Counter("llmman_loads", "llama-server starts, by outcome (ok, failed).",
                             ["model", "outcome"], registry=r)
        self.load_time = Histogram("llmman_load_seconds", "Seconds from launch to a ready llama-server.",
                                   ["model"], buckets=LOAD_BUCKETS, registry=r)
        self.evictions = Counter("llmman_evictions", "Models unloaded to make room for another.",
                                 ["model"], registry=r)
        self.crashes = Counter("llmman_crashes", "llama-server children that died on their own, by cause.",
                               ["model", "cause"], registry=r)
        self.restarts = Counter("llmman_restarts", "Loads of a model after it crashed or failed to load.",
                                ["model"], registry=r)
        self.forwards = Counter("llmman_forwards", "Requests sent on to a peer, by outcome.",
                                ["peer", "outcome"], registry=r)
        self.hops = Counter("llmman_hops", "Requests a peer forwarded here, by outcome.",
                            ["peer", "outcome"], registry=r)
        self.pulls = Counter("llmman_pulls", "Pulls and copies, by source (registry, peer) and outcome.",
                             ["source", "outcome"], registry=r)
        self.pull_bytes = Counter("llmman_pull_bytes", "Bytes fetched by pulls and copies.", ["source"],
                                  registry=r)
        self._known: set[str] = set()  # models loaded here or answered with a success (model labels)
        self._peers: set[str] = set()  # hop peer labels given so far (at most PEER_LABELS_MAX)
        if requests is not None and collect:
            r.register(RequestLogCollector(requests))

    def watch(self, scheduler: Scheduler) -> None:
        """Export ``scheduler``'s state at each scrape (:class:`SchedulerCollector`). Call it once; a
        no-op when not collecting."""
        if self.collect:
            self.registry.register(SchedulerCollector(scheduler, self.node))

    def model_label(self, model: str, status: int) -> str:
        """The ``model`` label of a request for ``model`` answered ``status``: the model itself once this
        node knows it (loaded here, or answered below 400: a model that exists somewhere), else
        :data:`UNKNOWN`, so made-up names add no series."""
        if model in self._known:
            return model
        if status < 400:
            self._known.add(model)
            return model
        return UNKNOWN

    def _peer_label(self, peer: str) -> str:
        if peer in self._peers:
            return peer
        if len(self._peers) < PEER_LABELS_MAX:
            self._peers.add(peer)
            return peer
        return OTHER

    # -- events (the data path calls these) --------------------------------------------------------------

    def request_done(self, row: RequestRow) -> None:
        """One finished request (the row the request log gets, llmman.obs.requestlog.RequestRow)."""
        if not self.collect:
            return
        model = _label(self.model_label(row.model, row.status))
        key = (row.route, row.dialect, row.status, model, row.node, row.kind)
        counts = self._by_request
        counts[key] = counts.get(key, 0) + 1
        per_model = (model, row.node, row.kind)
        figures = self._by_model.get(per_model)
        if figures is None:
            figures = self._by_model[per_model] = _ModelFigures()
        if row.prompt_tokens:
            figures.tokens_in += row.prompt_tokens
        if row.completion_tokens:
            figures.tokens_out += row.completion_tokens
        if row.ttft is not None:
            figures.ttft.observe(row.ttft)
        speed = row.tokens_per_s
        if speed is not None:
            figures.speed.observe(speed)

    def waited(self, model: str, seconds: float) -> None:
        """A request got its model after ``seconds`` (llmman.sched.table.Lease.load_duration)."""
        if not self.collect:
            return
        self.queue_wait.labels(_label(model)).observe(seconds)

    def load_done(self, model: str, seconds: float, *, ok: bool) -> None:
        """A llama-server start ended after ``seconds``: ready (``ok``) or failed."""
        if not self.collect:
            return
        self.loads.labels(model, "ok" if ok else "failed").inc()
        if ok:
            self._known.add(model)
            self.load_time.labels(model).observe(seconds)

    def evicted(self, model: str) -> None:
        """``model`` was unloaded (or marked to drain) to make room for another."""
        if not self.collect:
            return
        self.evictions.labels(model).inc()

    def crashed(self, model: str, cause: str) -> None:
        """``model``'s child died on its own (``cause``: llmman.runner.crash.Cause value)."""
        if not self.collect:
            return
        self.crashes.labels(model, cause).inc()

    def restarted(self, model: str) -> None:
        """``model`` is loaded again after a crash or a failed load."""
        if not self.collect:
            return
        self.restarts.labels(model).inc()

    def forwarded(self, peer: str, outcome: str) -> None:
        """A request was sent on to ``peer``: ``ok`` (it answered), ``failed`` (before its status line),
        ``refused`` (429/5xx/401 before its first byte: the next node was tried) or ``broken`` (after it)."""
        if not self.collect:
            return
        self.forwards.labels(peer, outcome).inc()

    def hop(self, peer: str, outcome: str) -> None:
        """A request forwarded here by ``peer`` (its address) was served: ``ok`` or ``error``."""
        if not self.collect:
            return
        self.hops.labels(self._peer_label(peer), outcome).inc()

    def pulled(self, source: str, outcome: str, nbytes: int = 0) -> None:
        """A pull (``source`` = ``registry``) or copy from a peer (``peer``) ended; ``nbytes`` fetched."""
        if not self.collect:
            return
        self.pulls.labels(source, outcome).inc()
        if nbytes:
            self.pull_bytes.labels(source).inc(nbytes)

    # -- exposition -----------------------------------------------------------------------------------

    def exposition(self, extra: Iterable[Metric] = ()) -> bytes:
        """The Prometheus text format of every family, then ``extra`` (the children's, folded in)."""
        text = generate_latest(self.registry)
        families = list(extra)
        if families:
            more = CollectorRegistry(auto_describe=False)
            more.register(_Fixed(families))
            text += generate_latest(more)
        return text


class _Buckets:
    """One histogram's figures: a count per bucket (the last one past every bound) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """One observation (in the first bucket whose bound is at least ``value``)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def exposed(self) -> list[tuple[str, float]]:
        """The cumulative ``(le, count)`` pairs of the text format, ``+Inf`` last."""
        out, total = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append((_le(bound), float(total)))
        return out


def _le(bound: float) -> str:
    """A bucket bound as the text format writes it (prometheus_client's own ``floatToGoString``)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


class _ModelFigures:
    """What the requests of one ``(model, node, kind)`` added up to: tokens, TTFT and speed."""

    __slots__ = ("speed", "tokens_in", "tokens_out", "ttft")

    def __init__(self) -> None:
        self.tokens_in = 0
        self.tokens_out = 0
        self.ttft = _Buckets(TTFT_BUCKETS)
        self.speed = _Buckets(SPEED_BUCKETS)


class RequestCollector(Collector):
    """``llmman_requests_total``, ``llmman_tokens_total``, ``llmman_time_to_first_token_seconds`` and
    ``llmman_generation_tokens_per_second`` from the figures :meth:`Metrics.request_done` keeps."""

    def __init__(self, requests: dict[tuple[str, str, int, str, str, str], int],
                 per_model: dict[tuple[str, str, str], _ModelFigures]) -> None:
        self._requests = requests
        self._per_model = per_model

    def describe(self) -> Iterator[Metric]:
        """The families without samples."""
        yield from self._families()

    @staticmethod
    def _families() -> tuple[CounterMetricFamily, CounterMetricFamily, HistogramMetricFamily,
                             HistogramMetricFamily]:
        per_model = ["model", "node", "kind"]
        return (
            CounterMetricFamily("llmman_requests", "Requests answered, by the node that served them.",
                                labels=["route", "dialect", "status", "model", "node", "kind"]),
            CounterMetricFamily("llmman_tokens",
                                "Tokens of answered requests: in = prompt, out = completion.",
                                labels=["direction", *per_model]),
            HistogramMetricFamily("llmman_time_to_first_token_seconds",
                                  "Seconds from arrival to the first token", labels=per_model),
            HistogramMetricFamily("llmman_generation_tokens_per_second",
                                  "Completion tokens per second after the first token, per request.",
                                  labels=per_model),
        )

    def collect(self) -> Iterator[Metric]:
        """The families with the figures so far (copied first: a writer in another thread is harmless)."""
        requests, tokens, ttft, speed = self._families()
        for (route, dialect, status, model, node, kind), count in list(self._requests.items()):
            requests.add_metric([route, dialect, str(status), model, node, kind], count)
        for (model, node, kind), figures in list(self._per_model.items()):
            labels = [model, node, kind]
            tokens.add_metric(["in", *labels], figures.tokens_in)
            tokens.add_metric(["out", *labels], figures.tokens_out)
            ttft.add_metric(labels, figures.ttft.exposed(), figures.ttft.sum)
            speed.add_metric(labels, figures.speed.exposed(), figures.speed.sum)
        yield from (requests, tokens, ttft, speed)


class _Fixed(Collector):
    """Families built elsewhere, collected as they are."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def _kind(snap: LoadedSnapshot) -> str:
    return "embedding" if snap.embedding else "chat"


def _state(snap: LoadedSnapshot) -> str:
    return "loading" if not snap.ready else "draining" if snap.draining else "ready"


def _rss(pid: int | None) -> int:
    if pid is None:
        return 0
    with contextlib.suppress(psutil.Error):
        return int(psutil.Process(pid).memory_info().rss)
    return 0


class SchedulerCollector(Collector):
    """Gauges read from the scheduler at collect time: loaded models (state, slots, in flight, queued,
    memory), the node's memory (capacity, planned, used), draining, and each model's failure record."""

    def __init__(self, scheduler: Scheduler, node: str) -> None:
        self._scheduler = scheduler
        self._node = node

    def describe(self) -> Iterator[Metric]:
        """The families without samples (so the registry knows the names and refuses duplicates)."""
        yield from self._families()
        yield from self._gpu_families()

    @staticmethod
    def _gpu_families() -> tuple[GaugeMetricFamily, ...]:
        labels = ["node", "device", "name"]
        return (
            GaugeMetricFamily("llmman_gpu_utilisation_percent", "How busy a GPU was over its driver's last "
                              "sample (NVML or AMD sysfs).", labels=labels),
            GaugeMetricFamily("llmman_gpu_temperature_celsius", "A GPU's temperature.", labels=labels),
            GaugeMetricFamily("llmman_gpu_power_watts", "Power a GPU draws.", labels=labels),
            GaugeMetricFamily("llmman_gpu_memory_used_bytes", "GPU memory in use, by any process.",
                              labels=labels),
            GaugeMetricFamily("llmman_gpu_memory_total_bytes", "A GPU's memory.", labels=labels),
        )

    def _gpu(self) -> Iterator[Metric]:
        """Per-GPU telemetry (llmman.sched.gpu.telemetry); no samples on a CPU or Apple node."""
        families = self._gpu_families()
        node = self._scheduler.node_memory
        if node is not None:
            figures = telemetry(node.accelerator)
            for device in node.devices:
                found = figures.get(device.index)
                if found is None:
                    continue
                labels = [self._node, str(device.index), device.name]
                for family, value in zip(families, (found.utilisation, found.temperature, found.power,
                                                    found.used, device.total), strict=True):
                    if value is not None:
                        family.add_metric(labels, value)
        yield from families

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        per_model = ["model", "kind", "node"]
        return (
            GaugeMetricFamily("llmman_model_loaded", "1 per loaded (or loading) model, with its state.",
                              labels=[*per_model, "state"]),
            GaugeMetricFamily("llmman_model_slots", "Requests a loaded model serves at once (-np).",
                              labels=per_model),
            GaugeMetricFamily("llmman_in_flight", "Requests being served now.", labels=per_model),
            GaugeMetricFamily("llmman_queued", "Requests waiting for a load or a free slot.",
                              labels=per_model),
            GaugeMetricFamily("llmman_model_memory_bytes",
                              "Memory a model takes: llama-server's figure once loaded, else the estimate.",
                              labels=per_model),
            GaugeMetricFamily("llmman_memory_capacity_bytes", "Memory llmman may fill with models (0 = no "
                              "limit).", labels=["node"]),
            GaugeMetricFamily("llmman_memory_planned_bytes", "Memory the loaded models are counted at.",
                              labels=["node"]),
            GaugeMetricFamily("llmman_memory_used_bytes", "Memory the children use now: their resident "
                              "memory plus the device memory llama-server reported.", labels=["node"]),
            GaugeMetricFamily("llmman_node_draining", "1 while the node takes no new placements.",
                              labels=["node"]),
            GaugeMetricFamily("llmman_model_failures", "Failures in a row of a model (crashes or failed "
                              "loads), with the last cause.", labels=["model", "cause", "node"]),
            GaugeMetricFamily("llmman_model_breaker_open", "1 once a model failed too often in a row to be "
                              "restarted by itself.", labels=["model", "node"]),
        )

    def collect(self) -> Iterator[Metric]:
        """The families with this moment's samples."""
        (loaded, slots, in_flight, queued, model_memory, capacity, planned, used, draining, failures,
         breaker) = self._families()
        node = self._node
        snaps = self._scheduler.snapshot()
        for snap in snaps:
            labels = [snap.reference, _kind(snap), node]
            loaded.add_metric([*labels, _state(snap)], 1)
            slots.add_metric(labels, snap.slots)
            in_flight.add_metric(labels, snap.in_flight)
            queued.add_metric(labels, snap.queued)
            model_memory.add_metric(labels, snap.memory)
        capacity.add_metric([node], self._scheduler.capacity)
        planned.add_metric([node], sum(s.memory for s in snaps))
        used.add_metric([node], sum(_rss(s.pid) + s.memory_device for s in snaps))
        draining.add_metric([node], 1 if self._scheduler.draining else 0)
        for key, failure in self._scheduler.healer.failures.items():
            failures.add_metric([key, failure.cause, node], failure.count)
            breaker.add_metric([key, node], 1 if failure.broken else 0)
        yield from (loaded, slots, in_flight, queued, model_memory, capacity, planned, used, draining,
                    failures, breaker)
        yield from self._gpu()


class RequestLogCollector(Collector):
    """The request log's writer: rows written, dropped (queue full) and lost to database errors."""

    def __init__(self, requests: RequestLog) -> None:
        self._log = requests

    def collect(self) -> Iterator[Metric]:
        """Counters read from the log at collect time."""
        rows = CounterMetricFamily("llmman_requestlog_rows", "Request-log rows, by what became of them.",
                                   labels=["outcome"])
        rows.add_metric(["written"], self._log.written)
        rows.add_metric(["dropped"], self._log.dropped)
        rows.add_metric(["failed"], self._log.failed)
        yield rows
