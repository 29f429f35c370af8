"""llmman.sdnotify: systemd's notification datagrams, the watchdog interval, and the watchdog task on a real
event loop (pinging while healthy, silent while a check fails or the loop is wedged)."""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llmman.sdnotify import Notifier, Watchdog, watchdog_interval

INTERVAL = 0.02  # seconds between the watchdog's ticks in these tests


def _parse(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket (systemd's end) and the ``NOTIFY_SOCKET`` value naming it."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(10)
        yield sock, str(path)


def test_notify_sends_one_datagram_of_lines(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    assert Notifier(path).notify(READY="1", STATUS="serving on http://127.0.0.1:1")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving on http://127.0.0.1:1"


def test_notify_to_an_abstract_socket() -> None:
    name = f"llmman-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        assert Notifier("@" + name).notify(WATCHDOG="1")
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_no_socket_does_nothing(tmp_path: Path) -> None:
    assert not Notifier("").enabled
    assert not Notifier("").notify(READY="1")
    assert not Notifier(str(tmp_path / "nobody")).notify(READY="1")  # gone: False, no exception


def test_a_full_queue_does_not_block(tmp_path: Path) -> None:
    """A reader that never reads: sends fail (False) instead of blocking the sender."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        notifier = Notifier(str(path))
        assert notifier.notify(WATCHDOG="1")
        sent = 1
        while notifier.notify(WATCHDOG="1"):  # the queue fills (net.unix.max_dgram_qlen), then False
            sent += 1
            assert sent < 100_000, "sends never failed: the queue has no end?"


@pytest.mark.parametrize(("usec", "pid", "expected"), [
    (0, 0, None),  # no WatchdogSec=
    (30_000_000, 0, 15.0),  # half of it, for any process
    (30_000_000, 4242, 15.0),  # meant for this process
    (30_000_000, 4343, None),  # meant for another one (a parent that forked this)
])
def test_watchdog_interval(usec: int, pid: int, expected: float | None) -> None:
    assert watchdog_interval(usec, pid, own_pid=4242) == expected


class _Loop:
    """An event loop in a thread running one :class:`Watchdog`, and a way to wedge that loop."""

    def __init__(self, watchdog: Callable[[], Watchdog]) -> None:
        self.loop = asyncio.new_event_loop()
        self.blocked = threading.Event()
        self.gate = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(watchdog,), daemon=True)
        self._thread.start()

    def _run(self, make: Callable[[], Watchdog]) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> Watchdog:
            dog = make()
            dog.start()
            return dog

        self.dog = self.loop.run_until_complete(start())
        self.loop.run_forever()
        self.loop.run_until_complete(self.dog.close())
        self.loop.close()

    def wedge(self) -> None:
        """Block the loop in a callback (a synchronous call that does not return) until :attr:`gate`."""
        def stuck() -> None:
            self.blocked.set()
            self.gate.wait(30)

        self.loop.call_soon_threadsafe(stuck)
        assert self.blocked.wait(10)

    def close(self) -> None:
        self.gate.set()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def _drain(sock: socket.socket) -> list[dict[str, str]]:
    """Every datagram already queued, without waiting."""
    out = []
    sock.setblocking(False)
    try:
        while True:
            out.append(_parse(sock.recv(4096)))
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(10)
    return out


def test_pings_while_healthy_withholds_while_not(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    problem: list[str] = []
    runner = _Loop(lambda: Watchdog(Notifier(path), INTERVAL, lambda: problem[0] if problem else None,
                                    serving="serving on x"))
    try:
        assert _parse(sock.recv(4096)) == {"WATCHDOG": "1"}
        problem.append("store unreadable: corrupt index.json")
        while (message := _parse(sock.recv(4096))) == {"WATCHDOG": "1"}:
            pass  # pings sent before the check saw the problem
        assert message == {
            "STATUS": "unhealthy: store unreadable: corrupt index.json; watchdog ping withheld"}
        for _ in range(3):  # every tick while it fails: a status, never a ping
            assert "WATCHDOG" not in _parse(sock.recv(4096))
        problem.clear()
        while "WATCHDOG" not in (message := _parse(sock.recv(4096))):
            pass
        assert message == {"WATCHDOG": "1", "STATUS": "serving on x"}  # back: the status says so once
        assert _parse(sock.recv(4096)) == {"WATCHDOG": "1"}
    finally:
        runner.close()


def test_a_check_that_raises_is_a_failed_check(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver

    def broken() -> str | None:
        raise RuntimeError("boom")

    runner = _Loop(lambda: Watchdog(Notifier(path), INTERVAL, broken))
    try:
        assert _parse(sock.recv(4096)) == {
            "STATUS": "unhealthy: health check failed: RuntimeError('boom'); watchdog ping withheld"}
    finally:
        runner.close()


def test_a_wedged_loop_sends_no_ping(receiver: tuple[socket.socket, str]) -> None:
    """The pings come from a task on the loop: while a callback blocks the loop, none is sent (a pinger in
    its own thread would go on pinging and hide the hang from systemd)."""
    sock, path = receiver
    runner = _Loop(lambda: Watchdog(Notifier(path), INTERVAL, lambda: None))
    try:
        assert _parse(sock.recv(4096)) == {"WATCHDOG": "1"}
        runner.wedge()
        _drain(sock)  # sent before the wedge (the loop, the only sender, is blocked now)
        sock.settimeout(25 * INTERVAL)
        with pytest.raises(TimeoutError):
            sock.recv(4096)
        sock.settimeout(10)
        runner.gate.set()  # the loop runs again: so do the pings
        assert _parse(sock.recv(4096)) == {"WATCHDOG": "1"}
    finally:
        runner.close()


def test_no_socket_no_task() -> None:
    async def scenario() -> None:
        dog = Watchdog(Notifier(""), INTERVAL, lambda: None)
        dog.start()
        assert dog._task is None
        await dog.close()

    asyncio.run(scenario())


def test_stop_ends_the_pings(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver

    async def scenario() -> None:
        dog = Watchdog(Notifier(path), INTERVAL, lambda: None)
        dog.start()
        assert _parse(await asyncio.to_thread(sock.recv, 4096)) == {"WATCHDOG": "1"}
        await dog.close()
        assert dog._task is not None and dog._task.done()

    asyncio.run(scenario())
