"""What the data path reports to, in one handle: the request log, the metrics, the children and the health.

:class:`Observer` is built once per daemon (:meth:`Observer.of`, in llmman.daemon) and reached through
``Services.obs``. The data path calls :meth:`Observer.request_done` once per finished request with the
row a :class:`~llmman.obs.stopwatch.Stopwatch` built; it never blocks and never raises. Bodies are handed in
only when :attr:`RequestLog.wants_bodies <llmman.obs.requestlog.RequestLog.wants_bodies>` says so. With
``metrics.collect`` and ``log.requests`` both off, :attr:`Observer.active` is False and the data path
watches nothing at all (llmman.api.observed: the answer goes out as it would without observation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmman.config.settings import Settings
from llmman.obs.children import Children, observed
from llmman.obs.health import Health
from llmman.obs.metrics import Metrics
from llmman.obs.requestlog import FILE_NAME, Bodies, RequestLog, RequestRow, Retention
from llmman.sched.plan import Launcher
from llmman.sched.scheduler import Scheduler


@dataclass
class Observer:
    """The request log, the metrics, the children's metrics and the health of one daemon.

    ``Observer()`` (a daemon assembled by hand, as in tests) records no rows and reads no scheduler.
    """

    metrics: Metrics = field(default_factory=lambda: Metrics(node=""))
    requests: RequestLog = field(default_factory=RequestLog.disabled)
    children: Children = field(default_factory=Children)
    health: Health = field(default_factory=Health)

    @classmethod
    def of(cls, settings: Settings) -> Observer:
        """The daemon's observer: the request log at ``<data_dir>/requests.db`` as ``log.*`` says (not
        started: :meth:`start`) and the metrics (the scheduler's gauges once :meth:`watch` is called)."""
        requests = RequestLog(settings.data_dir / FILE_NAME, bodies=Bodies(settings.bodies),
                              retention=Retention(age=settings.retention, max_size=settings.max_size),
                              enabled=settings.requests)
        metrics = Metrics(node=settings.node_name, requests=requests, collect=settings.collect)
        return cls(metrics=metrics, requests=requests)

    @property
    def active(self) -> bool:
        """True when a finished request is recorded anywhere (``metrics.collect`` or ``log.requests``
        on); False = the data path has nothing to report and need not watch the answer."""
        return self.metrics.collect or self.requests.enabled

    def launcher(self, launcher: Launcher) -> Launcher:
        """``launcher`` counting loads, crashes and restarts, and keeping the children for their metrics
        (llmman.obs.children.observed)."""
        return observed(launcher, self.metrics, self.children)

    def watch(self, scheduler: Scheduler) -> None:
        """Export ``scheduler``'s state in the metrics (llmman.obs.metrics.SchedulerCollector)."""
        self.metrics.watch(scheduler)

    def start(self) -> Observer:
        """Start the request log's writer thread; returns self."""
        self.requests.start()
        return self

    def request_done(self, row: RequestRow) -> None:
        """One finished request: a row for the log and the metrics' counters. Never blocks or raises."""
        self.requests.record(row)
        self.metrics.request_done(row)

    def close(self) -> None:
        """Write what the log still holds and stop its writer (blocks: call it in a thread)."""
        self.requests.close()
