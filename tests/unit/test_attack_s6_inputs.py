"""Session 6's attack on its own work, the inputs a careless operator or a hostile network gives: a DNS
name of hundreds of addresses (the log stays short), an address found twice in different spellings (one
peer), systemd variables that make no sense (``WATCHDOG_USEC=1``, a superscript digit, a ``NOTIFY_SOCKET``
that is a directory, a stream socket, too long a path, an abstract name no one bound), a peer set whose
addresses are new at every change (nothing is kept of the peers gone), a set of many unresponsive
peers (one that answers again is seen again without waiting on each of them in turn). The lookups are a
table (what is tested is what llmman does with an answer); the real DNS server is
tests/integration/test_attack_s6.py's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llmman.cluster.discovery import LOG_ADDRESSES, Answer, Discovery, DnsEntry, Found
from llmman.cluster.peers import Peers, parse_entries, peer_name
from llmman.config.environment import read_environment
from llmman.config.settings import load_settings
from llmman.config.table import HostAddress
from llmman.daemon import _Systemd
from llmman.sdnotify import MIN_PING_S, Notifier, watchdog_interval

BIG = DnsEntry("http", "big.example", 17434, False)


class Table:
    """A lookup answering every name with ``found``."""

    def __init__(self, found: list[str], port: int = 17434) -> None:
        self.found = found
        self.port = port

    async def __call__(self, entry: DnsEntry) -> Answer:
        return Answer(tuple(Found(host, self.port, entry.name) for host in self.found), 1.0)


async def test_a_name_of_200_addresses_logs_a_short_line(caplog: pytest.LogCaptureFixture) -> None:
    hosts = [f"10.1.{i // 250}.{i % 250 + 1}" for i in range(200)]
    discovery = Discovery((BIG,), Table(hosts))
    with caplog.at_level(logging.INFO, logger="llmman.cluster"):
        assert await discovery.refresh(BIG)
    assert len(discovery.addresses()) == 200  # every address is a peer
    (line,) = [r.getMessage() for r in caplog.records if "big.example" in r.getMessage()]
    assert "200 addresses" in line and f"and {200 - LOG_ADDRESSES} more" in line
    assert len(line) < 400, line  # not 200 addresses spelled out at every change


async def test_a_small_set_is_logged_whole(caplog: pytest.LogCaptureFixture) -> None:
    discovery = Discovery((BIG,), Table(["10.0.0.1", "10.0.0.2"]))
    with caplog.at_level(logging.INFO, logger="llmman.cluster"):
        await discovery.refresh(BIG)
    assert "big.example:17434 is 10.0.0.1:17434, 10.0.0.2:17434 (next" in caplog.text


@pytest.mark.parametrize("static", ["[0:0::1]:17434", "[::1]:17434", "127.0.0.1:17434", "http://[::0001]:17434"])
async def test_an_address_in_another_spelling_is_one_peer(static: str) -> None:
    entries = parse_entries([static, "big.example"])
    discovery = Discovery(entries, Table(["127.0.0.1", "::1"]))
    await discovery.refresh(BIG)
    names = [peer_name(a) for a in discovery.addresses()]
    assert len(names) == 2, names  # the static entry and the name's same address: one peer, not two


async def test_two_names_giving_one_address_are_one_peer() -> None:
    other = DnsEntry("http", "other.example", 17434, False)
    discovery = Discovery((BIG, other), Table(["10.0.0.1"]))
    await discovery.refresh(BIG)
    await discovery.refresh(other)
    assert [peer_name(a) for a in discovery.addresses()] == ["10.0.0.1:17434"]


# -- systemd's variables ------------------------------------------------------------------------------


@pytest.mark.parametrize(("usec", "expected"), [(1, MIN_PING_S), (1000, MIN_PING_S), (30_000_000, 15.0)])
def test_a_tiny_watchdog_does_not_spin_the_loop(usec: int, expected: float) -> None:
    assert watchdog_interval(usec, 0, own_pid=1) == expected


def test_a_watchdog_shorter_than_the_pings_is_warned_of(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(tmp_path / "notify"))
        settings = load_settings(env={"HOME": str(tmp_path), "LLMMAN_MODELS": str(tmp_path / "store"),
                                      "NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "1"},
                                 system_file=tmp_path / "none.conf", user_file=tmp_path / "none.conf")
        with caplog.at_level(logging.WARNING, logger="llmman"):
            _Systemd(settings, lambda: None)
    assert "WATCHDOG_USEC=1) is shorter than llmman pings" in caplog.text


@pytest.mark.parametrize("variable", ["WATCHDOG_USEC", "WATCHDOG_PID"])
def test_a_superscript_digit_is_no_number(variable: str) -> None:
    environment = read_environment({"HOME": "/nonexistent", variable: "\u00b2"})
    assert (environment.watchdog_usec, environment.watchdog_pid) == (0, 0)


def _stream_socket(tmp_path: Path) -> str:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "stream"))
    sock.listen()
    return str(tmp_path / "stream")  # the socket stays open until the test's process ends


@pytest.mark.parametrize("kind", ["missing", "directory", "stream", "long", "abstract", "undecodable"])
def test_a_notify_socket_that_cannot_be_sent_to_is_no_error(tmp_path: Path, kind: str) -> None:
    path = {"missing": lambda: str(tmp_path / "none" / "notify"), "directory": lambda: str(tmp_path),
            "stream": lambda: _stream_socket(tmp_path), "long": lambda: "/" + "a" * 200,
            "abstract": lambda: f"@llmman-nobody-{os.getpid()}",
            "undecodable": lambda: str(tmp_path) + "/\udcff"}[kind]()
    notifier = Notifier(path)
    assert notifier.enabled
    assert notifier.notify(READY="1", STATUS="serving") is False  # not sent, and no exception

    async def watchdog_runs() -> None:
        settings = load_settings(env={"HOME": str(tmp_path), "LLMMAN_MODELS": str(tmp_path / "store"),
                                      "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "40000"},
                                 system_file=tmp_path / "none.conf", user_file=tmp_path / "none.conf")
        checks: list[int] = []
        three = asyncio.Event()

        def check() -> None:
            checks.append(1)
            if len(checks) >= 3:
                three.set()

        systemd = _Systemd(settings, check)
        systemd.started()
        await three.wait()  # the pinger keeps running, its sends failing quietly
        systemd.stopping()
        await systemd.close()

    asyncio.run(asyncio.wait_for(watchdog_runs(), 10))


# -- a peer set that churns ----------------------------------------------------------------------------


async def test_peers_that_come_and_go_leave_nothing_behind() -> None:
    async with aiohttp.ClientSession() as session:
        peers = Peers(session, (), timeout=2.0)
        for round_ in range(20):  # a pod set whose addresses are new every time (pods restarted)
            addresses = [HostAddress("http", f"127.0.{round_ + 1}.{i}", 1) for i in range(1, 21)]
            peers.update(addresses)
            await asyncio.gather(*(peers._probe_one(a) for a in addresses))  # nothing listens: refused
        assert len(peers.addresses) == 20
        assert len(peers._fetching) <= 20, len(peers._fetching)  # 400 once: every name ever seen
        await peers.close()


async def test_a_peer_back_is_seen_without_waiting_on_every_unresponsive_one() -> None:
    holes = [socket.socket() for _ in range(20)]  # each accepts (the kernel's backlog), never answers
    for hole in holes:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)

    async def node(_: web.Request) -> web.Response:
        return web.json_response({"memory": 1000, "loaded": {}, "stored": {}, "name": "back"})

    app = web.Application()
    app.router.add_get("/llmman/node", node)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    back = HostAddress("http", "127.0.0.1", runner.addresses[0][1])
    silent = [HostAddress("http", "127.0.0.1", hole.getsockname()[1]) for hole in holes]
    try:
        async with aiohttp.ClientSession() as session:
            peers = Peers(session, (*silent, back), timeout=10.0, retry=0.05)
            for address in (*silent, back):  # all down: the silent ones, and one that is back now
                peers.mark_down(address, "attack", slow=True)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 8.0  # one probe timeout is 10 s: in turn, 20 of them come first
            try:
                while back not in peers.up():
                    assert loop.time() < deadline, "the peer that answers waited on every silent one"
                    await asyncio.sleep(0.05)
            finally:
                await peers.close()
    finally:
        for hole in holes:
            hole.close()
        await runner.cleanup()
