"""A real daemon under systemd's notification protocol: the test binds the datagram socket systemd would
(``NOTIFY_SOCKET``) and sets a small ``WATCHDOG_USEC``. ``READY=1`` comes only once the port answers,
``WATCHDOG=1`` keeps coming while ``/health`` passes and stops while it fails (a corrupt store, the same
fault that makes ``GET /health`` answer 503), ``STOPPING=1`` comes at SIGTERM, and llama-server children do
not inherit the notification variables."""

from __future__ import annotations

import queue
import resource
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from llmman.sdnotify import Notifier
from tests.integration.daemons import Daemon, free_port, model_daemon, start_daemon, wait_until

WATCHDOG_USEC = 300_000  # a ping every 0.15 s
TIMEOUT = 30.0


class NotifySocket:
    """systemd's end of ``NOTIFY_SOCKET``: a bound datagram socket whose messages a thread parses into a
    queue. The moment ``READY=1`` arrives, that thread asks ``url``'s ``/api/version`` once."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="llmman-sd-")  # short: sun_path holds 108 bytes
        self.path = str(Path(self._dir.name) / "notify")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self._sock.settimeout(0.2)
        self.messages: queue.Queue[dict[str, str]] = queue.Queue()
        self.ready_probe: int | str | None = None  # /api/version's status (or error) at READY=1
        self.url = ""
        self.port = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                datagram = self._sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            message = dict(line.split("=", 1) for line in datagram.decode().splitlines())
            if message.get("READY") == "1" and self.ready_probe is None:
                self.ready_probe = self._probe()
            self.messages.put(message)

    def _probe(self) -> int | str:
        """At once, once, no retry: READY=1 must mean the port accepts now (a bare connect first, the
        quickest check there is, then ``/api/version``)."""
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=5).close()
            return httpx.get(self.url + "/api/version", timeout=5).status_code
        except (OSError, httpx.HTTPError) as exc:
            return repr(exc)

    def next(self, timeout: float = TIMEOUT) -> dict[str, str]:
        """The next message; fails after ``timeout`` seconds without one."""
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no notification within {timeout:g}s") from None

    def until(self, key: str, value: str | None = None) -> tuple[dict[str, str], list[dict[str, str]]]:
        """Wait for a message with ``key`` (equal to ``value`` when given): it and those before it. Fails
        after :data:`TIMEOUT` seconds, however many other messages came meanwhile."""
        before = []
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                message = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if key in message and (value is None or message[key] == value):
                return message, before
            before.append(message)
        raise AssertionError(f"no {key}={value or '...'} within {TIMEOUT:g}s; got {before[-5:]}")

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self._sock.close()
        self._dir.cleanup()


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    try:
        yield sock
    finally:
        sock.close()


def _start(tmp: Path, notify: NotifySocket) -> Daemon:
    port = free_port()
    notify.url, notify.port = f"http://127.0.0.1:{port}", port
    return start_daemon(tmp, port=port, extra_env={"NOTIFY_SOCKET": notify.path,
                                                   "WATCHDOG_USEC": str(WATCHDOG_USEC)})


def test_ready_watchdog_health_and_stopping(tmp_path: Path, notify: NotifySocket) -> None:
    d = _start(tmp_path, notify)
    try:
        ready, before = notify.until("READY", "1")
        assert before == []  # nothing before READY=1 (no ping before systemd counts it started)
        assert notify.ready_probe == 200, f"/api/version at READY=1: {notify.ready_probe}"
        assert ready["STATUS"] == f"serving on {d.url}"
        for _ in range(3):
            assert notify.next() == {"WATCHDOG": "1"}  # it keeps coming

        # a real health failure: a corrupt store index, which GET /health answers 503 for
        index = d.store / "index.json"
        index.parent.mkdir(parents=True, exist_ok=True)
        index.write_text("{not json")
        unhealthy, _ = notify.until("STATUS")
        assert unhealthy["STATUS"].startswith("unhealthy: store unreadable: corrupt ")
        assert httpx.get(d.url + "/health", timeout=10).status_code == 503
        for _ in range(3):  # every tick while it fails says so, and pings nothing
            message = notify.next()
            assert "WATCHDOG" not in message and message["STATUS"].startswith("unhealthy: ")

        index.unlink()  # healthy again: the pings resume, the status says so
        back, _ = notify.until("WATCHDOG")
        assert back == {"WATCHDOG": "1", "STATUS": f"serving on {d.url}"}
        assert httpx.get(d.url + "/health", timeout=10).status_code == 200

        d.process.send_signal(signal.SIGTERM)
        stopping, _ = notify.until("STOPPING", "1")
        assert stopping["STATUS"].startswith("shutting down")
        assert int(stopping["EXTEND_TIMEOUT_USEC"]) >= 30_000_000  # at least the default 30 s grace
        assert d.process.wait(TIMEOUT) == 0
        Notifier(notify.path).notify(END="1")  # ours, after the daemon's last: all of its are before it
        _, after = notify.until("END", "1")
        assert all("WATCHDOG" not in m for m in after), after  # no ping once the shutdown began
    finally:
        d.stop()


@pytest.mark.model
def test_children_do_not_inherit_the_notify_socket(tmp_path: Path, model_file: Path,
                                                   notify: NotifySocket) -> None:
    env = {"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": str(WATCHDOG_USEC), "WATCHDOG_PID": "0"}
    with model_daemon(tmp_path, model_file, extra_env=env) as d:
        r = httpx.post(d.url + "/api/generate", json={"model": "smollm2:135m", "prompt": "hi",
                                                      "stream": False, "options": {"num_predict": 1}},
                       timeout=120)
        assert r.status_code == 200, r.text
        wait_until(lambda: bool(d.children()), "a llama-server child")
        child: psutil.Process = d.children()[0]
        environ = child.environ()
        assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} & environ.keys()
        assert psutil.Process(d.process.pid).environ()["NOTIFY_SOCKET"] == notify.path  # the daemon's own


def test_the_watchdogs_abort_prints_the_stacks(tmp_path: Path, notify: NotifySocket) -> None:
    """systemd's watchdog kills with SIGABRT (``WatchdogSignal=``): the daemon prints every thread's Python
    stack first (faulthandler), so the journal says where a wedged loop was stuck."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))  # no core file from the abort (children inherit it)
    try:
        d = _start(tmp_path, notify)
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))
    try:
        notify.until("READY", "1")
        d.process.send_signal(signal.SIGABRT)
        assert d.process.wait(TIMEOUT) == -signal.SIGABRT
        log = d.log_text()
        assert "Fatal Python error: Aborted" in log
        assert "llmman/daemon.py" in log  # the main thread's stack, down to the daemon's own frames
    finally:
        d.stop()
