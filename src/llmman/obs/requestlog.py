"""The request log: one row per request in SQLite (``<data_dir>/requests.db``, WAL), written off the data
path.

:meth:`RequestLog.record` is a non-blocking enqueue on a bounded queue (one C call); one writer thread takes
what is queued, inserts it in batches (one transaction each, gathered over :data:`BATCH_WINDOW_S`) and
runs the retention (:func:`prune`) every :data:`PRUNE_EVERY_S` seconds. Nothing the database does reaches
a request: a full queue drops the row (counted in :attr:`RequestLog.dropped`, one log line per overflow),
and a database that cannot be opened or
written (a read-only file or folder, a full disk, a file that is not a database) drops the batch (counted
in :attr:`RequestLog.failed`) with one log line per distinct error; the writer tries again with the next
batch, and logs once when writing works again.

Bodies (``log.bodies``) are kept only when asked for: ``request`` stores each request's body and answer
beside its row; ``conversation`` keeps one record per conversation key (``RequestRow.conversation``), the
latest turn's body (which holds the whole conversation so far) and answer, with its turn count (rows
without a key are kept per request). Retention (``log.retention``, ``log.max_size``) deletes rows, bodies and
conversations older than the retention, then the oldest bodies and rows until the file is under the size;
the database is created with ``auto_vacuum = INCREMENTAL`` so the freed pages are given back to the disk.
As a hard ceiling, SQLite's ``max_page_count`` holds the file to twice ``log.max_size``: past it an insert
fails with "database or disk is full", which prunes at once.

Readers (:mod:`llmman.obs.stats`) open their own read-only connections.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

log = logging.getLogger("llmman.obs.requestlog")

FILE_NAME = "requests.db"
QUEUE_SIZE = 10_000  # rows waiting for the writer; past it record() drops
BATCH = 500  # most rows in one transaction
BATCH_WINDOW_S = 0.05  # once a row arrives, the writer waits this long for more before writing them
PRUNE_EVERY_S = 60.0  # how often the writer runs the retention
RETRY_OPEN_S = 30.0  # how often a database that could not be opened is tried again
KINDS = ("local", "forwarded", "hop")  # served here for a client, sent on to a peer, served here for a peer

SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY,
    time REAL NOT NULL,
    node TEXT NOT NULL,
    route TEXT NOT NULL,
    dialect TEXT NOT NULL,
    model TEXT NOT NULL,
    status INTEGER NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    ttft REAL,
    duration REAL NOT NULL,
    tokens_per_s REAL,
    client TEXT NOT NULL,
    error TEXT NOT NULL,
    kind TEXT NOT NULL,
    conversation TEXT
);
CREATE INDEX IF NOT EXISTS requests_time ON requests (time);
CREATE TABLE IF NOT EXISTS bodies (
    request_id INTEGER PRIMARY KEY,
    time REAL NOT NULL,
    request BLOB,
    response BLOB
);
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    first REAL NOT NULL,
    last REAL NOT NULL,
    turns INTEGER NOT NULL,
    request BLOB,
    response BLOB
);
CREATE INDEX IF NOT EXISTS conversations_last ON conversations (last);
"""

COLUMNS = ("time", "node", "route", "dialect", "model", "status", "prompt_tokens", "completion_tokens",
           "ttft", "duration", "tokens_per_s", "client", "error", "kind", "conversation")
_INSERT = f"INSERT INTO requests ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"


class Bodies(Enum):
    """``log.bodies``: whether request and answer bodies are kept, and how."""

    OFF = "off"
    REQUEST = "request"  # each request's body and answer, beside its row
    CONVERSATION = "conversation"  # one record per conversation: its latest turn and answer


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One finished request, as the data path reports it (times in seconds).

    Attributes:
        time: unix time the request arrived.
        node: the node that served it (this node's name, or the peer's for a forwarded one).
        route: the path (``/api/chat``).
        dialect: ``ollama``, ``openai`` or ``anthropic`` (llmman.protocol.errors.Dialect values).
        model: the model as resolved (the full reference), else as the client named it.
        status: the HTTP status sent (an in-band error after the first byte: the status of that frame).
        prompt_tokens, completion_tokens: the answer's usage, None where unknown.
        ttft: seconds from arrival to the first token, None where nothing was generated.
        duration: seconds from arrival to the last byte.
        client: the client's address.
        error: the error message, empty when it succeeded.
        kind: ``local``, ``forwarded`` (sent on to ``node``) or ``hop`` (served here for a peer).
        conversation: the conversation key (llmman.api.inference.Call.conversation), if any.
        request_body, response_body: the bodies, when ``log.bodies`` keeps them (:attr:`RequestLog.bodies`).
    """

    time: float
    node: str
    route: str
    dialect: str
    model: str
    status: int
    duration: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft: float | None = None
    client: str = ""
    error: str = ""
    kind: str = "local"
    conversation: str | None = None
    request_body: bytes | None = None
    response_body: bytes | None = None
    speed: float | None = None  # generation tokens/s the answer itself reports (llama-server's timings)

    @property
    def tokens_per_s(self) -> float | None:
        """Generation speed: the answer's own figure when it reports one (:attr:`speed`), else completion
        tokens over the time after the first token; None where unknown (no first token: a whole answer)."""
        if self.speed is not None:
            return self.speed
        if not self.completion_tokens or self.ttft is None:
            return None
        generating = self.duration - self.ttft
        return self.completion_tokens / generating if generating > 0 else None

    def values(self) -> tuple[object, ...]:
        """The row's values in :data:`COLUMNS` order."""
        return (self.time, self.node, self.route, self.dialect, self.model[:400], self.status,
                self.prompt_tokens, self.completion_tokens, self.ttft, self.duration, self.tokens_per_s,
                self.client, self.error[:2000], self.kind, self.conversation)


@dataclass(frozen=True)
class Retention:
    """How long rows are kept (seconds; 0 = forever) and the most bytes the file may take (0 = no limit)."""

    age: float = 7 * 86400.0
    max_size: int = 256 << 20


class _Control:
    """A command for the writer thread: flush, prune or stop; ``done`` is set once it ran."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.done = threading.Event()


class RequestLog:
    """The request log of one daemon. :meth:`start` it, :meth:`record` rows, :meth:`close` it.

    Args:
        path: the database file (``<data_dir>/requests.db``).
        bodies: whether bodies are kept (``log.bodies``).
        retention: ``log.retention`` and ``log.max_size``.
        clock: unix seconds (injected for tests of the retention).
        enabled: False (``log.requests = off``) makes :meth:`record` a no-op and starts no thread.
    """

    def __init__(self, path: Path, *, bodies: Bodies = Bodies.OFF, retention: Retention | None = None,
                 clock: Callable[[], float] = time.time, enabled: bool = True,
                 queue_size: int = QUEUE_SIZE) -> None:
        self.path = Path(path)
        self.bodies = bodies
        self.retention = retention or Retention()
        self.enabled = enabled
        self._clock = clock
        # SimpleQueue: a put is one C call with no lock held in Python (record() is on the data path);
        # the bound is checked by record() against qsize().
        self._queue: queue.SimpleQueue[RequestRow | _Control] = queue.SimpleQueue()
        self._queue_size = queue_size
        self._thread: threading.Thread | None = None
        self._closed = False
        self._overflowing = False
        self._error: str | None = None  # the last write error logged (one line per distinct one)
        self.written = 0  # rows inserted
        self.dropped = 0  # rows dropped because the queue was full
        self.failed = 0  # rows lost to a database error

    @classmethod
    def disabled(cls) -> RequestLog:
        """A log that records nothing and reads as empty (a daemon assembled by hand, as in tests)."""
        return cls(Path(os.devnull), enabled=False)

    @property
    def wants_bodies(self) -> bool:
        """True when the data path should hand bodies in (``log.bodies`` is not ``off``)."""
        return self.enabled and self.bodies is not Bodies.OFF

    def start(self) -> RequestLog:
        """Start the writer thread (a no-op when disabled or started); returns self."""
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="llmman-requestlog", daemon=True)
            self._thread.start()
        return self

    def record(self, row: RequestRow) -> None:
        """Queue ``row`` for the writer; never blocks, never raises (a full queue drops it)."""
        if not self.enabled or self._closed:
            return
        if self._queue.qsize() < self._queue_size:
            self._queue.put(row)
            return
        self.dropped += 1
        if not self._overflowing:
            self._overflowing = True
            log.warning("request log: the writer is behind (%d rows queued); dropping rows until it "
                        "catches up", self._queue_size)

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until every row queued before the call is written (or dropped); False on timeout."""
        return self._command("flush", timeout)

    def prune(self, timeout: float = 10.0) -> bool:
        """Run the retention now on the writer thread and wait for it; False on timeout."""
        return self._command("prune", timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the writer. Idempotent; blocks up to ``timeout`` seconds."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._queue.put(_Control("stop"))
            self._thread.join(timeout)

    def _command(self, action: str, timeout: float) -> bool:
        if self._thread is None or not self._thread.is_alive():
            return False
        control = _Control(action)
        self._queue.put(control)
        return control.done.wait(timeout)

    # -- the writer thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        opened_at = -RETRY_OPEN_S
        next_prune = 0.0
        while True:
            try:
                item = self._queue.get(timeout=max(0.01, next_prune - time.monotonic()))
            except queue.Empty:
                item = None
            if isinstance(item, RequestRow):
                time.sleep(BATCH_WINDOW_S)  # let the rows of a burst of requests share one transaction
            batch = [] if item is None else [item]
            while len(batch) < BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            rows = [x for x in batch if isinstance(x, RequestRow)]
            controls = [x for x in batch if isinstance(x, _Control)]
            if conn is None and (controls or time.monotonic() - opened_at >= RETRY_OPEN_S):
                opened_at = time.monotonic()
                conn = self._open()
            if rows:
                conn = self._write(conn, rows)
            if self._queue.empty():
                self._overflowing = False
            prune_now = any(c.action == "prune" for c in controls) or time.monotonic() >= next_prune
            if prune_now and conn is not None:
                conn = self._guard(conn, lambda c: prune(c, self.retention, self._clock()))
                next_prune = time.monotonic() + PRUNE_EVERY_S
            elif prune_now:
                next_prune = time.monotonic() + PRUNE_EVERY_S
            for control in controls:
                control.done.set()
            if any(c.action == "stop" for c in controls):
                if conn is not None:
                    conn.close()
                return

    def _open(self) -> sqlite3.Connection | None:
        """The writer's connection with the schema in place, or None (logged) when that fails."""
        conn = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # takes effect on a new file only
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            if self.retention.max_size:
                page = int(conn.execute("PRAGMA page_size").fetchone()[0])
                conn.execute(f"PRAGMA max_page_count = {max(64, 2 * self.retention.max_size // page)}")
            conn.executescript(SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            if conn is not None:
                conn.close()
            self._failed(f"cannot open {self.path}: {exc}")
            return None
        self._recovered()
        return conn

    def _write(self, conn: sqlite3.Connection | None, rows: list[RequestRow]) -> sqlite3.Connection | None:
        """Insert ``rows`` in one transaction. When the file is full (``max_page_count``, or the disk), the
        retention runs and the rows go in one at a time, pruning again whenever it fills. Returns the
        connection (None once it failed: it is opened again later)."""
        if conn is None:
            self.failed += len(rows)
            return None
        try:
            with _transaction(conn):
                insert(conn, rows, self.bodies)
        except sqlite3.Error as exc:
            if not _full(exc):
                self.failed += len(rows)
                self._failed(f"cannot write to {self.path}: {exc}")
                return _keep(conn)
        else:
            self.written += len(rows)
            self._recovered()
            return conn
        for one in rows:
            for attempt in range(2):
                try:
                    with _transaction(conn):
                        insert(conn, [one], self.bodies)
                except sqlite3.Error as exc:
                    if attempt == 0 and _full(exc):
                        with contextlib.suppress(sqlite3.Error):
                            prune(conn, self.retention, self._clock())
                        continue
                    self.failed += 1
                    self._failed(f"cannot write to {self.path}: {exc}")
                    if not _full(exc):
                        return _keep(conn)
                else:
                    self.written += 1
                break
        return conn

    def _guard(self, conn: sqlite3.Connection, action: Callable[[sqlite3.Connection], None]
               ) -> sqlite3.Connection | None:
        try:
            action(conn)
        except sqlite3.Error as exc:
            self._failed(f"retention of {self.path} failed: {exc}")
            return _keep(conn)
        return conn

    def _failed(self, message: str) -> None:
        if message != self._error:
            log.warning("request log: %s; requests are served, their rows are not kept", message)
            self._error = message

    def _recovered(self) -> None:
        if self._error is not None:
            log.info("request log: writing to %s again", self.path)
            self._error = None


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _full(exc: sqlite3.Error) -> bool:
    """True for SQLite's "database or disk is full"."""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


def _keep(conn: sqlite3.Connection) -> sqlite3.Connection | None:
    """``conn`` after an error: itself while it still answers, else None (closed; opened again later)."""
    try:
        conn.execute("SELECT 1").fetchone()
    except sqlite3.Error:
        with contextlib.suppress(sqlite3.Error):
            conn.close()
        return None
    return conn


def insert(conn: sqlite3.Connection, rows: Iterable[RequestRow], bodies: Bodies) -> None:
    """Insert ``rows`` (and their bodies, as ``bodies`` says) within the caller's transaction."""
    if bodies is Bodies.OFF:  # one statement for the batch: the writer holds the GIL least
        conn.executemany(_INSERT, [row.values() for row in rows])
        return
    for row in rows:
        cursor = conn.execute(_INSERT, row.values())
        if row.request_body is None and row.response_body is None:
            continue
        if bodies is Bodies.CONVERSATION and row.conversation:
            conn.execute(
                "INSERT INTO conversations (id, first, last, turns, request, response) "
                "VALUES (?, ?, ?, 1, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET last = excluded.last, turns = turns + 1, "
                "request = excluded.request, response = excluded.response",
                (row.conversation, row.time, row.time, row.request_body, row.response_body))
        else:
            conn.execute("INSERT INTO bodies (request_id, time, request, response) VALUES (?, ?, ?, ?)",
                         (cursor.lastrowid, row.time, row.request_body, row.response_body))


def used_bytes(conn: sqlite3.Connection) -> int:
    """Bytes the database's live pages take (its pages less the free list)."""
    page = int(conn.execute("PRAGMA page_size").fetchone()[0])
    pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    return (pages - free) * page


def prune(conn: sqlite3.Connection, retention: Retention, now: float) -> None:
    """The retention: drop what is older than ``retention.age``, then the oldest bodies, conversations and
    rows (a tenth at a time) until the live pages fit ``retention.max_size``; give freed pages back."""
    if retention.age > 0:
        cutoff = now - retention.age
        with _transaction(conn):
            conn.execute("DELETE FROM requests WHERE time < ?", (cutoff,))
            conn.execute("DELETE FROM bodies WHERE time < ?", (cutoff,))
            conn.execute("DELETE FROM conversations WHERE last < ?", (cutoff,))
    if retention.max_size:
        for table, order in (("bodies", "time"), ("conversations", "last"), ("requests", "time")):
            while used_bytes(conn) > retention.max_size:
                count = int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
                if count == 0:
                    break
                key = "request_id" if table == "bodies" else "id"
                with _transaction(conn):
                    conn.execute(f"DELETE FROM {table} WHERE {key} IN "
                                 f"(SELECT {key} FROM {table} ORDER BY {order} LIMIT ?)",
                                 (max(1, count // 10),))
    conn.executescript("PRAGMA incremental_vacuum;")  # executescript steps it to the end (execute: 1 page)
