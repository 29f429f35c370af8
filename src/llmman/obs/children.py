"""The llama-server children as metrics see them: loads, crashes and restarts counted where children start
and die, and each child's own ``/metrics`` (it runs with ``--metrics``, llmman.runner.argv) folded in.

:func:`observed` wraps the daemon's launcher (llmman.daemon.make_launcher): every launch is timed
(:meth:`Metrics.load_done`), a launch of a model that crashed or failed to load before counts as a restart,
and the on-exit callback (a child dying on its own) counts a crash. It also keeps each running child's
base URL by pid (:class:`Children`), since the scheduler's snapshot shows pids only; :func:`scrape` asks the
children the scheduler still holds for their ``/metrics`` and relabels every sample with ``model`` (and
``kind``: chat or embedding), merging one family per name over all children.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from llmman.errors import RunnerError
from llmman.obs.metrics import Metrics
from llmman.sched.plan import Launcher, ModelPlan, Runner
from llmman.sched.table import LoadedSnapshot

SCRAPE_TIMEOUT_S = 2.0  # a child that does not answer its /metrics in time is left out of this scrape


@dataclass(frozen=True)
class Child:
    """One running child: the model it serves, chat or embedding, and where it listens."""

    model: str
    kind: str
    base_url: str


class Children:
    """The running children by pid, as the wrapped launcher started them."""

    def __init__(self) -> None:
        self._by_pid: dict[int, Child] = {}

    def add(self, pid: int | None, child: Child) -> None:
        """A child is ready."""
        if pid is not None:
            self._by_pid[pid] = child

    def current(self, snaps: Iterable[LoadedSnapshot]) -> list[Child]:
        """The children the scheduler holds now (``snaps``); the others are forgotten."""
        live = {s.pid for s in snaps if s.ready and s.pid is not None}
        for pid in [p for p in self._by_pid if p not in live]:
            del self._by_pid[pid]
        return list(self._by_pid.values())


def observed(launcher: Launcher, metrics: Metrics, children: Children) -> Launcher:
    """``launcher``, counting loads, load time, restarts and crashes in ``metrics``, keeping ``children``."""
    failed: set[str] = set()  # table keys whose last child crashed or failed to load

    async def launch(plan: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        def exited(runner: Runner) -> None:
            failed.add(plan.key)
            cause = runner.exit_cause.value if runner.exit_cause is not None else "unknown"
            metrics.crashed(plan.reference, cause)
            on_exit(runner)

        if plan.key in failed:
            metrics.restarted(plan.reference)
        started = time.monotonic()
        try:
            runner = await launcher(plan, exited)
        except RunnerError:
            failed.add(plan.key)
            metrics.load_done(plan.reference, time.monotonic() - started, ok=False)
            raise
        failed.discard(plan.key)
        metrics.load_done(plan.reference, time.monotonic() - started, ok=True)
        children.add(runner.pid, Child(plan.reference, "embedding" if plan.embedding else "chat",
                                       runner.base_url))
        return runner

    return launch


async def scrape(children: Iterable[Child], limit_s: float = SCRAPE_TIMEOUT_S) -> list[Metric]:
    """Every child's ``/metrics``, relabelled and merged by family name (children that fail are left out)."""
    listed = list(children)
    if not listed:
        return []
    client_timeout = aiohttp.ClientTimeout(total=limit_s)
    async with aiohttp.ClientSession(timeout=client_timeout) as session:
        texts = await asyncio.gather(*(_fetch(session, c.base_url) for c in listed))
    merged: dict[str, Metric] = {}
    for child, text in zip(listed, texts, strict=True):
        if text is None:
            continue
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError:  # not the text format: leave this child out
            continue
        for family in families:
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation, family.type)
            elif into.type != family.type:
                continue
            for sample in family.samples:
                labels = {**sample.labels, "model": child.model, "kind": child.kind}
                into.add_sample(sample.name, labels, sample.value, sample.timestamp)
    return list(merged.values())


async def _fetch(session: aiohttp.ClientSession, base_url: str) -> str | None:
    try:
        async with session.get(base_url + "/metrics") as response:
            if response.status != 200:
                return None
            return await response.text()
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None
