"""The daemon's side of systemd's protocol (llmman.daemon._Systemd): what it sends and when, from the
settings' ``NOTIFY_SOCKET``/``WATCHDOG_USEC``/``WATCHDOG_PID``; and children's environment without them.
The whole protocol against a real daemon is tests/integration/test_systemd_notify.py."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmman.config.settings import Settings, load_settings
from llmman.daemon import _Systemd, child_environ


def _settings(tmp_path: Path, **env: str) -> Settings:
    return load_settings(env={"HOME": str(tmp_path), "LLMMAN_MODELS": str(tmp_path / "store"), **env},
                         system_file=tmp_path / "none.conf", user_file=tmp_path / "none.conf")


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(10)
        yield sock, str(path)


def _parse(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


def test_ready_then_pings_then_stopping(tmp_path: Path, receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    systemd = _Systemd(_settings(tmp_path, NOTIFY_SOCKET=path, WATCHDOG_USEC="40000",
                                 WATCHDOG_PID=str(os.getpid())), lambda: None)

    async def scenario() -> None:
        systemd.started()
        assert _parse(sock.recv(4096)) == {"READY": "1", "STATUS": "serving on http://127.0.0.1:17434"}
        assert _parse(await asyncio.to_thread(sock.recv, 4096)) == {"WATCHDOG": "1"}
        systemd.stopping()
        await systemd.close()

    asyncio.run(scenario())
    messages = [_parse(sock.recv(4096))]
    while "STOPPING" not in messages[-1]:
        messages.append(_parse(sock.recv(4096)))
    # the default grace (30 s) + the cut margin (2 s) + the children's stop (10 s) + 10 s of slack
    assert messages[-1] == {"STOPPING": "1", "STATUS": "shutting down: finishing answers, stopping "
                            "llama-server", "EXTEND_TIMEOUT_USEC": "52000000"}


def test_watchdog_meant_for_another_process(tmp_path: Path, receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    systemd = _Systemd(_settings(tmp_path, NOTIFY_SOCKET=path, WATCHDOG_USEC="40000",
                                 WATCHDOG_PID=str(os.getpid() + 1)), lambda: None)
    assert systemd._watchdog is None
    systemd.started()
    assert "READY" in _parse(sock.recv(4096))


def test_nothing_without_notify_socket(tmp_path: Path) -> None:
    systemd = _Systemd(_settings(tmp_path, WATCHDOG_USEC="40000"), lambda: None)

    async def scenario() -> None:
        systemd.started()
        systemd.stopping()
        assert systemd._watchdog is not None and systemd._watchdog._task is None  # never started
        await systemd.close()

    assert not systemd._notifier.enabled
    asyncio.run(scenario())


def test_children_do_not_get_the_notify_variables() -> None:
    environ = {"PATH": "/bin", "NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "30000000",
               "WATCHDOG_PID": "1", "HOME": "/var/lib/llmman"}
    assert child_environ(environ) == {"PATH": "/bin", "HOME": "/var/lib/llmman"}
