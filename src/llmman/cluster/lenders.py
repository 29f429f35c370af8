"""The client of the peers' ``/llmman/rpc/workers`` routes: leasing, renewing and releasing the RPC workers
of one split child (docs/split.md).

:func:`lease_workers` asks every lending peer of a plan (llmman.cluster.split.SplitPlan) for its worker at
once, with the peers' own session and key (llmman.cluster.peers.Peers); :class:`Leases` holds what they
answered: it renews each lease every third of its length from the moment it is lent (through the child's
load), calls ``lost`` once when a lender answers the renewal with 404 (the worker died, expired or was
stopped) or has not renewed it for a whole lease, and deletes every worker on :meth:`Leases.release`. It
implements llmman.sched.plan.WorkerLeases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from llmman.cluster.split import Share
from llmman.errors import LlmmanError

__all__ = ["RPC_WORKERS", "Leases", "Worker", "lease_workers"]

log = logging.getLogger("llmman.cluster.lenders")

RPC_WORKERS = "/llmman/rpc/workers"
LEASE_TIMEOUT_S = 120.0  # a lender starts the worker before it answers: up to its binary's start
CALL_TIMEOUT_S = 5.0  # a renewal or a release


@dataclass(frozen=True)
class Worker:
    """One worker a peer lent: its id there, where llama-server reaches it, its memory and lease."""

    node: str
    url: str
    id: str
    endpoint: str
    memory: int
    lease: float


def _error(node: str, status: int, body: bytes) -> LlmmanError:
    """A lender's refusal as this node's error: its 507 stays a 507 (the pool lacks memory), anything else
    is a 503 (the split cannot be made now)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    why = doc.get("error") if isinstance(doc, dict) else None
    text = why if isinstance(why, str) else body[:200].decode("utf-8", "replace")
    code = "insufficient_memory" if status == 507 else "split_unavailable"
    return LlmmanError(f"peer {node} did not lend an RPC worker ({status}: {text})",
                       status=507 if status == 507 else 503, code=code)


def _worker(share: Share, doc: object) -> Worker:
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    ident, endpoint, lease = doc.get("id"), doc.get("endpoint"), doc.get("lease")
    memory = doc.get("memory", share.memory)
    if not isinstance(ident, str) or not ident or not isinstance(endpoint, str) or ":" not in endpoint:
        raise ValueError(f"no id or endpoint in {doc!r:.200}")
    if isinstance(lease, bool) or not isinstance(lease, int | float) or lease <= 0:
        raise ValueError(f"no lease in {doc!r:.200}")
    return Worker(share.node, share.url, ident, endpoint, memory if isinstance(memory, int) else share.memory,
                  float(lease))


async def _lease_one(session: aiohttp.ClientSession, headers: Mapping[str, str], share: Share, *,
                     owner: str, model: str) -> Worker:
    body = {"owner": owner, "model": model, "memory": share.memory}
    try:
        async with session.post(share.url + RPC_WORKERS, json=body, headers=dict(headers),
                                timeout=aiohttp.ClientTimeout(total=LEASE_TIMEOUT_S)) as response:
            raw = await response.read()
            if response.status != 201:
                raise _error(share.node, response.status, raw)
            return _worker(share, orjson.loads(raw))
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        raise LlmmanError(f"peer {share.node} did not lend an RPC worker: {exc or type(exc).__name__}",
                          status=503, code="split_unavailable") from exc


async def lease_workers(session: aiohttp.ClientSession, headers: Mapping[str, str],
                        shares: Sequence[Share], *, owner: str, model: str,
                        ended: Callable[[], None] | None = None) -> Leases:
    """Ask each share's peer for a worker of ``share.memory`` bytes for ``model`` (``owner``: this node's
    id), all at once; the workers in ``shares``' order. ``ended`` is called once when they are released.

    Raises:
        LlmmanError: a peer refused (507 when one lacked the memory, else 503) or did not answer; the
            workers the others lent are released first.
    """
    results = await asyncio.gather(*(_lease_one(session, headers, s, owner=owner, model=model)
                                     for s in shares), return_exceptions=True)
    workers = [r for r in results if isinstance(r, Worker)]
    failures = [r for r in results if isinstance(r, BaseException)]
    leases = Leases(session, headers, workers, ended=ended)
    if failures:
        await leases.release()
        worst = next((f for f in failures if isinstance(f, LlmmanError) and f.status == 507), failures[0])
        raise worst
    leases.start()
    return leases


class Leases:
    """The workers of one split child (llmman.sched.plan.WorkerLeases).

    Args:
        session, headers: the peers' session and headers (the peer key, the hop mark).
        workers: what the lenders answered, in ``--rpc`` order.
        ended: called once, by the first :meth:`release`.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, session: aiohttp.ClientSession, headers: Mapping[str, str],
                 workers: Sequence[Worker], *, ended: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._session = session
        self._headers = dict(headers)
        self.workers = tuple(workers)
        self._ended = ended
        self._clock = clock
        self._spent = False
        self._task: asyncio.Task[None] | None = None
        self._lost: Callable[[str], None] | None = None
        self._why: str | None = None  # why a worker was lost, once one is
        self._renewed = {w.id: clock() for w in self.workers}

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The workers' ``host:port`` for ``--rpc``."""
        return tuple(w.endpoint for w in self.workers)

    @property
    def spent(self) -> bool:
        return self._spent

    def start(self) -> None:
        """Renew every lease every third of the shortest one, from now (a lender counts its lease from its
        answer, and loading the model onto the workers takes a while) until :meth:`release`."""
        if self._task is None and not self._spent and self.workers:
            self._task = asyncio.create_task(self._renew_all(), name="rpc worker renewals")

    def watch(self, lost: Callable[[str], None]) -> None:
        """Call ``lost(why)`` once a worker is gone (at once if one is already)."""
        self._lost = lost
        self.start()
        if self._why is not None:
            lost(self._why)

    async def _renew_all(self) -> None:
        period = min(w.lease for w in self.workers) / 3
        while True:
            await asyncio.sleep(period)
            results = await asyncio.gather(*(self._renew(w) for w in self.workers))
            why = next((r for r in results if r is not None), None)
            if why is not None:
                log.warning("split ends: %s", why)
                self._why = why
                if self._lost is not None:
                    self._lost(why)
                return

    async def _renew(self, worker: Worker) -> str | None:
        """Renew ``worker``'s lease: None when renewed (or not yet to be given up), else why it is lost."""
        url = f"{worker.url}{RPC_WORKERS}/{worker.id}/renew"
        try:
            async with self._session.post(url, headers=self._headers,
                                          timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)) as response:
                await response.read()
                if response.status == 404:
                    return f"the RPC worker on {worker.node} ({worker.endpoint}) is gone"
                if response.status == 200:
                    self._renewed[worker.id] = self._clock()
                    return None
                failure: str = f"answered {response.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            failure = str(exc) or type(exc).__name__
        if self._clock() - self._renewed[worker.id] >= worker.lease:
            return f"peer {worker.node} has not renewed its RPC worker for {worker.lease:g} s ({failure})"
        log.info("renewing the RPC worker on %s failed (%s); trying again", worker.node, failure)
        return None

    async def release(self) -> None:
        """Stop the renewals and delete every worker (errors logged: a lender that is gone has stopped it,
        or will when its lease runs out). Idempotent; the first call tells ``ended``."""
        if self._spent:
            return
        self._spent = True
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        if self._ended is not None:
            self._ended()
        await asyncio.gather(*(self._delete(w) for w in self.workers))

    async def _delete(self, worker: Worker) -> None:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with self._session.delete(f"{worker.url}{RPC_WORKERS}/{worker.id}", headers=self._headers,
                                            timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)) as response:
                await response.read()
                return
        log.info("releasing the RPC worker on %s failed; its lease will run out", worker.node)

    def describe(self) -> list[dict[str, Any]]:
        """The workers as a log or a test reads them."""
        return [{"node": w.node, "id": w.id, "endpoint": w.endpoint, "memory": w.memory}
                for w in self.workers]
