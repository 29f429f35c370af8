"""The transfers in progress on this node: every pull and every copy from a peer, for ``/llmman/node``
(``transfers``), the dashboard and a cold ``llmman run`` (docs/dashboard.md).

Every transfer goes through :class:`llmman.registry.puller.Puller` (``pull``, ``ensure``, ``pull_via``),
which opens one :class:`Transfer` in its :class:`Transfers` table for the time it runs and feeds it the
progress lines it emits anyway (Ollama's ``{"status", "digest", "total", "completed"}``): bytes are
counted per blob, so parallel layers add up and a blob reported twice is not counted twice. A transfer
that succeeds leaves the table at once; one that fails stays :data:`FAILED_KEEP_S` seconds with its
error, so that a page polling every few seconds still sees why, then goes. Nothing transferring costs
nothing: the table is an empty dict and a snapshot of it an empty list.

Entry (``Transfer.document``)::

    {"model": "docker.io/ai/smollm2:135m", "kind": "pull" | "copy", "source": "registry-1.docker.io",
     "status": "pulling 3f2a…", "completed": bytes, "total": bytes, "started_at": unix seconds,
     "elapsed": seconds, "error": "..." (only when it failed)}

``source`` is the registry host of a pull, the peer's ``host:port`` of a copy; ``total`` is 0 until the
manifest is read, then the sum of its blobs' sizes (a Hugging Face pull's, as each file starts).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["COPY", "FAILED_KEEP_S", "PULL", "Transfer", "Transfers"]

PULL, COPY = "pull", "copy"
FAILED_KEEP_S = 30.0
"""How long a failed transfer stays listed with its error."""

Emit = Callable[[dict[str, Any]], None]


class Transfer:
    """One transfer in progress: what, from where, and its bytes so far. Updated by the pull's threads
    through :meth:`expect`, :meth:`advance` and :meth:`observe`; read through :meth:`document`; all under
    the table's lock."""

    def __init__(self, model: str, kind: str, source: str, lock: threading.Lock) -> None:
        self.model, self.kind, self.source = model, kind, source
        self.status = ""
        self.error: str | None = None
        self.started_at = time.time()
        self._started = time.monotonic()
        self.ended: float | None = None  # monotonic time it failed (a finished one leaves the table)
        self._blobs: dict[str, tuple[int, int]] = {}  # digest -> (completed, total)
        self._lock = lock

    def expect(self, sizes: dict[str, int]) -> None:
        """The blobs the manifest lists (digest -> size), counted in ``total`` before each one starts."""
        with self._lock:
            for digest, size in sizes.items():
                self._blobs.setdefault(digest, (0, max(0, size)))

    def feeding(self, emit: Emit) -> Emit:
        """An emit that reads each progress line (:meth:`observe`) and passes it on to ``emit``."""
        def feed(line: dict[str, Any]) -> None:
            self.observe(line)
            emit(line)

        return feed

    def advance(self, digest: str, completed: int, total: int) -> None:
        """Blob ``digest`` has ``completed`` of its ``total`` bytes (called as each chunk is written, so
        the table is current between two rate-limited progress lines)."""
        with self._lock:
            self._blobs[digest] = (min(max(0, completed), total), total)

    def observe(self, line: dict[str, Any]) -> None:
        """Read one progress line of the pull (its status, and a blob's ``completed``/``total``)."""
        status, digest = line.get("status"), line.get("digest")
        total, completed = line.get("total"), line.get("completed")
        with self._lock:
            if isinstance(status, str):
                self.status = status
            if isinstance(digest, str) and isinstance(total, int):
                done = completed if isinstance(completed, int) else 0
                self._blobs[digest] = (min(max(0, done, self._blobs.get(digest, (0, 0))[0]), total), total)

    def document(self, now: float) -> dict[str, Any]:
        """This transfer as the ``transfers`` entry of ``/llmman/node`` (see the module docstring);
        ``now`` is :func:`time.monotonic`. Called with the table's lock held."""
        doc: dict[str, Any] = {
            "model": self.model, "kind": self.kind, "source": self.source, "status": self.status,
            "completed": sum(done for done, _ in self._blobs.values()),
            "total": sum(total for _, total in self._blobs.values()),
            "started_at": round(self.started_at, 3),
            "elapsed": round((self.ended if self.ended is not None else now) - self._started, 3),
        }
        if self.error is not None:
            doc["error"] = self.error
        return doc


class Transfers:
    """The table of transfers in progress (thread-safe), keyed by the model's reference: a reference has
    one transfer at a time (the puller serialises them per reference), and a new one replaces a failed
    one still listed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, Transfer] = {}

    @contextmanager
    def track(self, model: str, kind: str, source: str) -> Iterator[Transfer]:
        """List a transfer of ``model`` (``kind`` :data:`PULL` or :data:`COPY`, from ``source``) while the
        block runs, and yield it (feed it with :meth:`Transfer.feeding`). On success the entry goes; on an
        exception it stays :data:`FAILED_KEEP_S` with the error's words (the exception goes on)."""
        transfer = Transfer(model, kind, source, self._lock)
        with self._lock:
            self._open[model] = transfer
        try:
            yield transfer
        except BaseException as exc:
            with self._lock:
                transfer.error = str(getattr(exc, "message", "") or exc) or type(exc).__name__
                transfer.ended = time.monotonic()
            raise
        else:
            with self._lock:
                if self._open.get(model) is transfer:
                    del self._open[model]

    def snapshot(self) -> list[dict[str, Any]]:
        """Every transfer listed now, oldest first (failed ones past :data:`FAILED_KEEP_S` dropped)."""
        if not self._open:
            return []
        now = time.monotonic()
        with self._lock:
            for model, t in list(self._open.items()):
                if t.ended is not None and now - t.ended > FAILED_KEEP_S:
                    del self._open[model]
            return [t.document(now) for t in sorted(self._open.values(), key=lambda t: t.started_at)]
