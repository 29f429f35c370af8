"""Log files on disk (llmman.runner.logfiles, llmman.runner.logs): rotation by size for a child's log and
the daemon's own, reading the last lines back across rotated files, following a log across a rotation,
and the ``llmman logs`` arguments. The route and the command against real daemons are in
tests/integration/test_logs.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.handlers
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llmman.cli.commands_logs import logs_query
from llmman.cli.main import build_parser
from llmman.runner import logfiles
from llmman.runner.logs import ChildLog


def test_child_log_names_follow_the_scheduler_key() -> None:
    assert logfiles.child_log_name("docker.io/ai/smollm2:135m") == "docker.io_ai_smollm2_135m.log"
    assert logfiles.child_log_name("docker.io/ai/e:1#embedding") == "docker.io_ai_e_1_embedding.log"


def test_rotate_shifts_the_files_and_keeps_only_the_backups(tmp_path: Path) -> None:
    path = tmp_path / "m.log"
    for generation in range(5):
        path.write_text(f"gen{generation}\n")
        logfiles.rotate(path, backups=3)
    assert not path.exists()
    assert [logfiles.backup(path, i).read_text() for i in (1, 2, 3)] == ["gen4\n", "gen3\n", "gen2\n"]
    assert not logfiles.backup(path, 4).exists()


def _lines(count: int, start: int = 0) -> bytes:
    return b"".join(f"line {i:04d} {'x' * 20}\n".encode() for i in range(start, start + count))


def test_a_child_log_rotates_by_size_and_never_keeps_more_than_its_backups(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "m.log"
    log = ChildLog(path, ring_lines=10, max_bytes=300, backups=2)
    log.open()
    log.feed("stdout", _lines(100))  # 100 lines of 31 bytes: ~10 files' worth
    log.close()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["m.log", "m.log.1", "m.log.2"]
    assert all(p.stat().st_size <= 300 for p in path.parent.iterdir())
    assert path.read_bytes().endswith(b"line 0099 " + b"x" * 20 + b"\n")
    kept = b"".join(p.read_bytes() for p in (logfiles.backup(path, 2), logfiles.backup(path, 1), path))
    assert kept.endswith(_lines(len(kept.splitlines()), 100 - len(kept.splitlines())))  # newest, in order


def test_a_reopened_child_log_counts_what_its_file_already_holds(tmp_path: Path) -> None:
    path = tmp_path / "m.log"
    path.write_bytes(b"y" * 290)
    log = ChildLog(path, ring_lines=10, max_bytes=300, backups=1)
    log.open()
    log.feed("stdout", b"a line longer than ten bytes\n")
    log.close()
    assert logfiles.backup(path, 1).read_bytes() == b"y" * 290
    assert path.read_bytes() == b"a line longer than ten bytes\n"


def test_tail_reads_back_into_rotated_files(tmp_path: Path) -> None:
    path = tmp_path / "m.log"
    logfiles.backup(path, 2).write_text("one\ntwo\n")
    logfiles.backup(path, 1).write_text("three\n")
    path.write_text("four\nfive\n")
    assert logfiles.tail(path, 2) == ["four", "five"]
    assert logfiles.tail(path, 4) == ["two", "three", "four", "five"]
    assert logfiles.tail(path, 50) == ["one", "two", "three", "four", "five"]
    assert logfiles.tail(path, 0) == []
    assert logfiles.tail(tmp_path / "absent.log", 5) == []


def test_tail_of_a_large_file_reads_only_its_end(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_bytes(_lines(20_000))  # 620 kB: several read blocks
    assert logfiles.tail(path, 3) == [f"line {i:04d} {'x' * 20}" for i in (19997, 19998, 19999)]
    assert len(logfiles.tail(path, 5000)) == 5000


class _Follower:
    """``logfiles.follow(path)`` running in a task, its lines in a queue."""

    def __init__(self, path: Path) -> None:
        self.lines: asyncio.Queue[str] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(path))

    async def _run(self, path: Path) -> None:
        async for line in logfiles.follow(path, poll=0.01):
            self.lines.put_nowait(line)

    async def next(self) -> str:
        """The next line it yields (10 s at most)."""
        return await asyncio.wait_for(self.lines.get(), 10)

    async def first_of(self, write: Callable[[], None]) -> str:
        """Call ``write`` until the follower yields a line, and return it: follow() opens the file at its
        end at a moment of its own, so the first writes may come before it."""
        async with asyncio.timeout(10):
            while self.lines.empty():
                write()
                with contextlib.suppress(TimeoutError):
                    return await asyncio.wait_for(self.lines.get(), 0.05)
        return await self.next()

    async def until(self, last: str) -> list[str]:
        """The lines it yields up to and including ``last`` (10 s at most)."""
        got = [await self.next()]
        while got[-1] != last:
            got.append(await self.next())
        return got


def _append(path: Path, text: str) -> Callable[[], None]:
    def write() -> None:
        with path.open("a") as file:
            file.write(text)
    return write


async def test_follow_yields_new_lines_across_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "m.log"
    path.write_text("old line, before following\n")
    follower = _Follower(path)
    assert await follower.first_of(_append(path, "first\n")) == "first"
    # room for the second line only: the third rotates the file (once), the fourth goes to the new one
    log = ChildLog(path, ring_lines=10, max_bytes=path.stat().st_size + 40, backups=3)
    log.open()
    log.feed("stdout", b"second line after the start\n")
    log.feed("stdout", b"third line: this one rotates the file\n")
    log.feed("stdout", b"fourth, in the new file\n")
    log.close()
    assert logfiles.backup(path, 1).read_text().endswith("second line after the start\n")
    got = [line for line in await follower.until("fourth, in the new file") if line != "first"]
    assert got == [
        "second line after the start", "third line: this one rotates the file", "fourth, in the new file"]
    follower.task.cancel()


async def test_follow_waits_for_a_file_that_does_not_exist_yet(tmp_path: Path) -> None:
    path = tmp_path / "later.log"
    follower = _Follower(path)
    assert await follower.first_of(_append(path, "hello\n")) == "hello"
    follower.task.cancel()


@pytest.fixture()
def daemon_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger("llmman")
    saved = root.handlers[:], root.level, root.propagate
    yield root
    for handler in root.handlers:
        if handler not in saved[0]:
            handler.close()
    root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]


def test_the_daemon_log_goes_to_a_rotated_file_as_well(tmp_path: Path, daemon_logger: logging.Logger) -> None:
    from llmman.daemon import _configure_logging

    _configure_logging(False, tmp_path / "logs")
    (to_file,) = [h for h in daemon_logger.handlers if isinstance(h, logging.handlers.RotatingFileHandler)]
    assert (to_file.maxBytes, to_file.backupCount) == (logfiles.MAX_BYTES, logfiles.BACKUPS)
    logging.getLogger("llmman.test").info("a line for the file")
    to_file.flush()
    assert logfiles.tail(tmp_path / "logs" / logfiles.DAEMON_LOG, 1)[0].endswith("INFO a line for the file")


def test_an_unwritable_logs_dir_leaves_stderr_only(tmp_path: Path, daemon_logger: logging.Logger) -> None:
    from llmman.daemon import _configure_logging

    (tmp_path / "logs").write_text("a file where the directory should be")
    _configure_logging(False, tmp_path / "logs")
    assert [type(h) for h in daemon_logger.handlers] == [logging.StreamHandler]


@pytest.mark.parametrize(("argv", "model", "follow", "lines", "node"), [
    (["logs"], None, False, 100, None),
    (["logs", "smollm2", "-f"], "smollm2", True, 100, None),
    (["logs", "-n", "5", "--node", "bee"], None, False, 5, "bee"),
    (["logs", "qwen:0.5b", "--follow", "--lines", "0", "--node", "10.0.0.5:17434"],
     "qwen:0.5b", True, 0, "10.0.0.5:17434"),
])
def test_logs_arguments(argv: list[str], model: str | None, follow: bool, lines: int,
                        node: str | None) -> None:
    args = build_parser().parse_args(argv)
    assert (args.verb, args.model, args.follow, args.lines, args.node) == ("logs", model, follow, lines, node)


def test_logs_query_names_only_what_was_asked() -> None:
    assert logs_query(None, lines=100, follow=False, node=None) == "/llmman/logs?tail=100"
    assert logs_query("qwen:0.5b", lines=0, follow=True, node="bee") == \
        "/llmman/logs?tail=0&model=qwen%3A0.5b&follow=1&node=bee"
