"""The request log (llmman.obs.requestlog) on a real SQLite file: rows, batches, the bounded queue, bodies per
request and per conversation, retention by age and size, stats and filters (llmman.obs.stats), and a
database that cannot be written (read-only, a folder in its place, full) leaving record() harmless."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmman.obs.requestlog import Bodies, RequestLog, RequestRow, Retention, used_bytes
from llmman.obs.stats import RowFilter, percentile, recent, stats
from llmman.obs.stopwatch import Stopwatch

NOW = 1_800_000_000.0
DAY = 86400.0


def row(i: int = 0, **kw: object) -> RequestRow:
    fields: dict[str, object] = dict(time=NOW + i, node="spark", route="/api/chat", dialect="ollama",
                                     model="docker.io/ai/smollm2:135m", status=200, duration=2.0,
                                     prompt_tokens=10, completion_tokens=20, ttft=1.0, client="127.0.0.1")
    fields.update(kw)
    return RequestRow(**fields)  # type: ignore[arg-type]


@contextlib.contextmanager
def opened(path: Path, **kw: object) -> Iterator[RequestLog]:
    requests = RequestLog(path, clock=lambda: NOW, **kw).start()  # type: ignore[arg-type]
    try:
        yield requests
    finally:
        requests.close()


def count(path: Path, table: str = "requests") -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_a_row_is_written_with_every_column(tmp_path: Path) -> None:
    db = tmp_path / "requests.db"
    with opened(db) as requests:
        requests.record(row(error="", conversation="c1"))
        assert requests.flush()
        assert requests.written == 1
    got = recent(db, RowFilter())
    assert len(got) == 1
    assert {k: v for k, v in got[0].items() if k != "id"} == {
        "time": NOW, "node": "spark", "route": "/api/chat", "dialect": "ollama",
        "model": "docker.io/ai/smollm2:135m", "status": 200, "prompt_tokens": 10, "completion_tokens": 20,
        "ttft": 1.0, "duration": 2.0, "tokens_per_s": 20.0, "client": "127.0.0.1", "error": "",
        "kind": "local", "conversation": "c1"}
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_tokens_per_s_is_the_speed_after_the_first_token() -> None:
    assert row(completion_tokens=30, ttft=0.5, duration=2.0).tokens_per_s == 20.0
    assert row(completion_tokens=None).tokens_per_s is None
    assert row(ttft=None).tokens_per_s is None
    assert row(ttft=2.0, duration=2.0).tokens_per_s is None


def test_many_rows_are_written_in_batches(tmp_path: Path) -> None:
    db = tmp_path / "requests.db"
    with opened(db) as requests:
        for i in range(1234):
            requests.record(row(i))
        assert requests.flush()
        assert (requests.written, requests.dropped, requests.failed) == (1234, 0, 0)
    assert count(db) == 1234


def test_a_full_queue_drops_with_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "requests.db"
    requests = RequestLog(db, queue_size=3)  # not started: nothing drains the queue
    with caplog.at_level(logging.WARNING, logger="llmman.obs.requestlog"):
        for i in range(10):
            requests.record(row(i))
    assert requests.dropped == 7
    assert len([r for r in caplog.records if "dropping rows" in r.getMessage()]) == 1
    requests.start()
    try:
        assert requests.flush()
        assert requests.written == 3
    finally:
        requests.close()


def test_a_disabled_log_records_nothing_and_starts_nothing(tmp_path: Path) -> None:
    requests = RequestLog(tmp_path / "requests.db", enabled=False).start()
    requests.record(row())
    assert not requests.flush()
    requests.close()
    assert not (tmp_path / "requests.db").exists()
    assert recent(tmp_path / "requests.db", RowFilter()) == []
    assert stats(tmp_path / "requests.db", 0.0) == []


def test_bodies_are_kept_only_when_asked(tmp_path: Path) -> None:
    off, per_request = tmp_path / "off.db", tmp_path / "request.db"
    for path, bodies in ((off, Bodies.OFF), (per_request, Bodies.REQUEST)):
        with opened(path, bodies=bodies) as requests:
            requests.record(row(request_body=b'{"q": 1}', response_body=b'{"a": 2}'))
            assert requests.flush()
    assert count(off, "bodies") == 0
    with contextlib.closing(sqlite3.connect(per_request)) as conn:
        rows = conn.execute("SELECT requests.id, request, response FROM bodies "
                            "JOIN requests ON requests.id = bodies.request_id").fetchall()
    assert [(r[1], r[2]) for r in rows] == [(b'{"q": 1}', b'{"a": 2}')]


def test_bodies_per_conversation_keep_the_latest_turn(tmp_path: Path) -> None:
    db = tmp_path / "requests.db"
    with opened(db, bodies=Bodies.CONVERSATION) as requests:
        for turn in range(3):
            requests.record(row(turn, conversation="conv", request_body=f"turn {turn}".encode(),
                                response_body=f"answer {turn}".encode()))
        requests.record(row(9, request_body=b"no key", response_body=b"kept per request"))
        assert requests.flush()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        convs = conn.execute("SELECT id, first, last, turns, request, response FROM conversations").fetchall()
        bodies = conn.execute("SELECT request FROM bodies").fetchall()
    assert convs == [("conv", NOW, NOW + 2, 3, b"turn 2", b"answer 2")]
    assert bodies == [(b"no key",)]
    assert count(db) == 4


def test_retention_deletes_what_is_older_than_its_age(tmp_path: Path) -> None:
    db = tmp_path / "requests.db"
    forever = Retention(age=0, max_size=0)
    with opened(db, bodies=Bodies.REQUEST, retention=forever) as requests:
        for age in (10 * DAY, 8 * DAY, 6 * DAY, 0.0):
            requests.record(row(time=NOW - age, request_body=b"x", response_body=b"y"))
        assert requests.flush()
    with opened(db, bodies=Bodies.CONVERSATION, retention=forever) as requests:
        requests.record(row(time=NOW - 9 * DAY, conversation="old", request_body=b"x"))
        requests.record(row(time=NOW - 1 * DAY, conversation="new", request_body=b"x"))
        assert requests.flush()
    assert (count(db), count(db, "bodies"), count(db, "conversations")) == (6, 4, 2)
    with opened(db, retention=Retention(age=7 * DAY, max_size=0)) as requests:
        assert requests.prune()
    assert sorted(r["time"] for r in recent(db, RowFilter())) == [NOW - 6 * DAY, NOW - DAY, NOW]
    assert count(db, "bodies") == 2
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT id FROM conversations").fetchall() == [("new",)]


def test_retention_by_size_drops_the_oldest_bodies_first(tmp_path: Path) -> None:
    db = tmp_path / "requests.db"
    limit = 256 << 10
    with opened(db, bodies=Bodies.REQUEST, retention=Retention(age=0, max_size=0)) as requests:
        for i in range(200):
            requests.record(row(i, request_body=os.urandom(4096), response_body=b"a"))
        assert requests.flush()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert used_bytes(conn) > 3 * limit
    with opened(db, bodies=Bodies.REQUEST, retention=Retention(age=0, max_size=limit)) as requests:
        assert requests.prune()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert used_bytes(conn) <= limit
        kept = [r[0] for r in conn.execute("SELECT requests.time FROM bodies JOIN requests "
                                           "ON requests.id = bodies.request_id ORDER BY requests.time")]
    assert count(db) == 200  # the rows are small: only bodies had to go
    assert kept and kept[-1] == NOW + 199 and kept[0] > NOW  # the newest bodies stay
    assert db.stat().st_size <= 2 * limit  # the freed pages went back to the disk (auto_vacuum)


def test_the_file_never_grows_past_twice_the_size(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "requests.db"
    limit = 128 << 10
    with opened(db, bodies=Bodies.REQUEST, retention=Retention(age=0, max_size=limit)) as requests:
        for i in range(300):  # ~1.2 MB of bodies, far past the ceiling, without waiting for the retention
            requests.record(row(i, request_body=os.urandom(4096)))
        assert requests.flush()
        assert requests.written + requests.failed == 300
        assert requests.written > 0
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert used_bytes(conn) <= 2 * limit
    assert db.stat().st_size <= 2 * limit + 4096


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` cannot be written: immutable for root (chmod does not stop root), else mode 0444."""
    if os.geteuid() == 0:
        chattr = shutil.which("chattr")
        assert chattr, "chattr (e2fsprogs) is needed to make a file read-only for root"
        subprocess.run([chattr, "+i", str(path)], check=True)
        try:
            yield
        finally:
            subprocess.run([chattr, "-i", str(path)], check=True)
    else:
        path.chmod(0o444)
        path.parent.chmod(0o555)
        try:
            yield
        finally:
            path.parent.chmod(0o755)
            path.chmod(0o644)


def test_a_read_only_database_leaves_record_harmless(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "requests.db"
    with opened(db) as requests:
        requests.record(row(0))
        assert requests.flush()
    with read_only(db), caplog.at_level(logging.WARNING, logger="llmman.obs.requestlog"):
        with opened(db) as requests:
            for i in range(1, 4):
                requests.record(row(i))
                assert requests.flush()
            assert (requests.written, requests.failed) == (0, 3)
        warnings = [r.getMessage() for r in caplog.records if r.name == "llmman.obs.requestlog"]
        assert len(warnings) == 1, warnings  # one line, not one per batch
        assert "rows are not kept" in warnings[0]
        assert [r["time"] for r in recent(db, RowFilter())] == [NOW]  # still readable


def test_a_folder_in_place_of_the_database_leaves_record_harmless(tmp_path: Path) -> None:
    db = tmp_path / "requests.db"
    db.mkdir()
    with opened(db) as requests:
        requests.record(row())
        assert requests.flush()
        assert (requests.written, requests.failed) == (0, 1)


def test_writing_resumes_once_the_database_can_be_opened(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "requests.db"
    db.mkdir()
    with opened(db) as requests, caplog.at_level(logging.INFO, logger="llmman.obs.requestlog"):
        requests.record(row(0))
        assert requests.flush()
        db.rmdir()
        requests.record(row(1))
        assert requests.flush()  # a flush tries to open the database again at once
        assert (requests.written, requests.failed) == (1, 1)
        assert any("writing to" in r.getMessage() for r in caplog.records)
    assert [r["time"] for r in recent(db, RowFilter())] == [NOW + 1]


def test_stats_per_model_and_node(tmp_path: Path) -> None:
    db = tmp_path / "requests.db"
    with opened(db) as requests:
        for i in range(20):  # ttft 0.1 .. 2.0, duration 1.1 .. 3.0, 10 tokens each after the first one
            requests.record(row(i, ttft=0.1 * (i + 1), duration=0.1 * (i + 1) + 1.0, completion_tokens=10,
                                prompt_tokens=5))
        requests.record(row(20, status=500, error="boom", ttft=None, completion_tokens=None, prompt_tokens=3))
        requests.record(row(21, node="other", status=200))
        requests.record(row(22, model="docker.io/ai/b:1", status=404, error="not found", ttft=None,
                            completion_tokens=None, prompt_tokens=None))
        requests.record(row(-3600, ttft=99.0))  # outside the window
        assert requests.flush()
    got = {(s["model"], s["node"]): s for s in stats(db, NOW - 60)}
    assert set(got) == {("docker.io/ai/smollm2:135m", "spark"), ("docker.io/ai/smollm2:135m", "other"),
                        ("docker.io/ai/b:1", "spark")}
    main = got["docker.io/ai/smollm2:135m", "spark"]
    assert (main["requests"], main["errors"], main["tokens_in"], main["tokens_out"]) == (21, 1, 103, 200)
    assert main["tokens_per_s_avg"] == pytest.approx(10.0)
    assert main["tokens_per_s_peak"] == pytest.approx(10.0)
    assert main["ttft_p50"] == pytest.approx(1.0)
    assert main["ttft_p95"] == pytest.approx(1.9)
    assert main["latency_p50"] == pytest.approx(2.0)  # 21 latencies: 1.1 .. 3.0 and the error's 2.0
    assert main["latency_p95"] == pytest.approx(2.9)
    other = got["docker.io/ai/b:1", "spark"]
    assert (other["requests"], other["errors"]) == (1, 1)
    assert (other["ttft_p50"], other["tokens_per_s_avg"]) == (None, None)
    assert stats(db, NOW - 60, NOW + 10)[0]["requests"] == 11 - 1  # until is exclusive: NOW .. NOW+9


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


def test_recent_rows_filter_and_limit(tmp_path: Path) -> None:
    db = tmp_path / "requests.db"
    with opened(db) as requests:
        requests.record(row(0, model="a"))
        requests.record(row(1, model="b", node="n2"))
        requests.record(row(2, model="a", status=503, error="busy"))
        requests.record(row(3, model="a", status=200, error="cut mid-stream"))
        assert requests.flush()
    times = lambda which: [r["time"] - NOW for r in recent(db, which)]  # noqa: E731
    assert times(RowFilter()) == [3, 2, 1, 0]
    assert times(RowFilter(model="a")) == [3, 2, 0]
    assert times(RowFilter(node="n2")) == [1]
    assert times(RowFilter(status=503)) == [2]
    assert times(RowFilter(status="error")) == [3, 2]
    assert times(RowFilter(status="ok")) == [1, 0]
    assert times(RowFilter(since=NOW + 2)) == [3, 2]
    assert times(RowFilter(limit=2)) == [3, 2]


def test_a_stopwatch_times_the_row() -> None:
    ticks = iter([100.0, 100.25, 102.0])  # arrival, first token, end (a second first_token reads none)
    watch = Stopwatch(clock=lambda: next(ticks), wall=lambda: NOW)
    assert watch.ttft is None
    watch.first_token()
    watch.first_token()  # ignored: the first one counts
    got = watch.row(node="spark", route="/api/chat", dialect="ollama", model="m", status=200,
                    completion_tokens=35)
    assert (got.time, got.ttft, got.duration) == (NOW, 0.25, 2.0)
    assert got.tokens_per_s == 20.0


def test_a_log_built_by_hand_reads_as_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with opened(tmp_path / "requests.db") as requests:  # a real log in the working directory
        requests.record(row())
        assert requests.flush()
    monkeypatch.chdir(tmp_path)
    assert recent(RequestLog.disabled().path, RowFilter()) == []
