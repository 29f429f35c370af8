"""Peers from DNS (cluster/discovery.py, cluster/peers.py): entries, the TTL clamp, the answer -> peer-set
logic (a failure keeps the last set, no address empties it), SRV, leaving this node out, the peer set
changing under :class:`Peers` (real aiohttp peers on loopback), and TLS to an address verified as the name
(a real TLS server with an ``openssl`` certificate naming only the DNS name).

The lookups here are a table (:class:`Table`): what is tested is what llmman does with an answer. The
lookups themselves run against a real DNS server in tests/integration/test_dns_peers.py.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from tests.unit.test_cluster_peer_state import Steps

from llmman.cluster.discovery import (
    MAX_TTL_S,
    MIN_TTL_S,
    RETRY_S,
    Answer,
    Discovery,
    DnsEntry,
    EntrySet,
    Found,
    LookupFailed,
    ServerNames,
    clamp_ttl,
    dns_server,
    is_dns_name,
    next_set,
)
from llmman.cluster.peers import Peers, parse_entries, peer_name
from llmman.cluster.source import is_local_address, is_self
from llmman.config.table import HostAddress, parse_host
from llmman.errors import ConfigError

DEADLINE_S = 10.0
POOL = DnsEntry("http", "pool.example", 17434, False)
SRV = DnsEntry("http", "_llmman._tcp.pool.example", 17434, True)


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition``, polling the loop, failing after DEADLINE_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


# -- entries ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("host", "dns"), [
    ("10.0.0.5", False), ("::1", False), ("[::1]", False), ("localhost", False), ("LOCALHOST.", False),
    ("asahi", True), ("pool.example", True), ("_llmman._tcp.pool.example", True), ("10.0.0.5.nip.io", True),
])
def test_a_host_is_looked_up_unless_it_is_an_ip_or_localhost(host: str, dns: bool) -> None:
    assert is_dns_name(host) is dns


def test_entries_are_static_addresses_or_dns_names_in_order() -> None:
    own = parse_host("127.0.0.9:5000")
    entries = parse_entries([" 10.0.0.5", "localhost:9000", "Pool.Example.", "https://pool.example",
                             "_llmman._tcp.pool.example", "127.0.0.9:5000", "pool.example:17434", "",
                             "[::1]"], own)
    assert entries == (
        parse_host("10.0.0.5"), parse_host("localhost:9000"), POOL,
        DnsEntry("https", "pool.example", 443, False), SRV, parse_host("[::1]"),
    )  # this node itself and the repeated name are left out


@pytest.mark.parametrize("text", ["http://", "ftp://pool.example", "pool.example:notaport", ":9000"])
def test_a_bad_entry_stops_the_daemon(text: str) -> None:
    with pytest.raises(ConfigError, match=r"aggregation\.peers"):
        parse_entries([text])


@pytest.mark.parametrize(("text", "expected"), [
    ("", None), (" ", None), ("127.0.0.1", ("127.0.0.1", 53)), ("127.0.0.1:5353", ("127.0.0.1", 5353)),
    ("[::1]:5353", ("::1", 5353)), ("[::1]", ("::1", 53)), ("::1", ("::1", 53)),
    ("localhost:53", ("127.0.0.1", 53)),
])
def test_the_dns_server_setting(text: str, expected: tuple[str, int] | None) -> None:
    assert dns_server(text) == expected


@pytest.mark.parametrize("text", ["127.0.0.1:", "127.0.0.1:x", "127.0.0.1:70000", "[::1]x",
                                  "nowhere.invalid"])
def test_a_bad_dns_server_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match=r"aggregation\.dns_server"):
        dns_server(text)


# -- the TTL and the set of one entry ----------------------------------------------------------------


@pytest.mark.parametrize(("ttl", "wait"), [
    (0, MIN_TTL_S), (0.2, MIN_TTL_S), (1, 1.0), (30, 30.0), (MAX_TTL_S, MAX_TTL_S), (86400, MAX_TTL_S),
    (None, RETRY_S),
])
def test_the_ttl_is_clamped(ttl: float | None, wait: float) -> None:
    assert clamp_ttl(ttl) == wait


def found(*hosts: str, port: int = 17434, name: str = "pool.example") -> tuple[Found, ...]:
    return tuple(Found(h, port, name) for h in hosts)


def test_an_answer_is_the_set_sorted_and_asked_again_after_its_ttl() -> None:
    now = next_set(None, Answer(found("10.0.0.9", "10.0.0.10", "::1", "10.0.0.9"), 0))
    assert now == EntrySet(found("10.0.0.9", "10.0.0.10", "::1"), MIN_TTL_S, None)
    assert next_set(now, Answer(found("10.0.0.10", "10.0.0.9", "::1"), 7)).found == now.found  # rotated


def test_no_address_empties_the_set_and_asks_again_soon() -> None:
    before = next_set(None, Answer(found("10.0.0.9"), 600))
    assert before.wait == MAX_TTL_S
    assert next_set(before, Answer((), None)) == EntrySet((), RETRY_S, None)


def test_a_failed_lookup_keeps_the_last_set() -> None:
    before = next_set(None, Answer(found("10.0.0.9", "10.0.0.8"), 5))
    failed = next_set(before, LookupFailed("SERVFAIL"))
    assert failed == EntrySet(before.found, RETRY_S, "SERVFAIL")
    assert next_set(failed, LookupFailed("timeout")).found == before.found  # and keeps it
    assert next_set(None, LookupFailed("timeout")) == EntrySet((), RETRY_S, "timeout")  # none yet: none
    assert next_set(failed, Answer(found("10.0.0.7"), 5)) == EntrySet(found("10.0.0.7"), 5.0, None)


# -- the peer set of every entry ---------------------------------------------------------------------


class Table:
    """A lookup answering from a table a test changes: an :class:`Answer` or a :class:`LookupFailed`
    per name; it counts the lookups."""

    def __init__(self, answers: dict[str, Answer | LookupFailed]) -> None:
        self.answers = answers
        self.asked = 0

    async def __call__(self, entry: DnsEntry) -> Answer:
        self.asked += 1
        answer = self.answers[entry.name]
        if isinstance(answer, LookupFailed):
            raise answer
        return answer


def addresses(*texts: str) -> tuple[HostAddress, ...]:
    return tuple(parse_host(t) for t in texts)


async def test_every_entry_stands_for_its_set_in_order_without_this_node() -> None:
    https = DnsEntry("https", "secure.example", 443, False)
    table = Table({
        "pool.example": Answer(found("127.0.0.3", "127.0.0.2", "127.0.0.4"), 5),
        "_llmman._tcp.pool.example": Answer(found("127.0.0.5", port=9001, name="n5.pool.example")
                                            + found("127.0.0.2", port=9001, name="n2.pool.example"), 5),
        "secure.example": Answer(found("10.0.0.1", port=443, name="secure.example"), 5),
    })
    static = parse_host("10.9.9.9:1")
    discovery = Discovery((POOL, static, SRV, https), table, own=parse_host("127.0.0.3:17434"))
    assert discovery.addresses() == (static,)  # nothing looked up yet
    for entry in (POOL, SRV, https):
        assert await discovery.refresh(entry) is True
    assert discovery.addresses() == (
        *addresses("127.0.0.2:17434", "127.0.0.4:17434"), static,  # 127.0.0.3:17434 is this node
        *addresses("127.0.0.2:9001", "127.0.0.5:9001"), HostAddress("https", "10.0.0.1", 443))
    assert discovery.names.name_of("10.0.0.1", 443) == "secure.example"  # https entries only
    assert discovery.names.name_of("127.0.0.2", 9001) is None
    async with aiohttp.ClientSession() as session:
        peers = Peers(session, discovery.addresses(), discovery=discovery)
        assert peers.server_name(HostAddress("https", "10.0.0.1", 443)) == "secure.example"
        assert peers.server_name(HostAddress("http", "127.0.0.2", 9001)) is None
    assert await discovery.refresh(POOL) is False  # the same answer: no change


def this_machines_address() -> str | None:
    """The address this machine sends from towards a far address (its LAN address), None without a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("203.0.113.1", 9))  # nothing is sent: a UDP connect only picks the route
        except OSError:
            return None
        host = str(sock.getsockname()[0])
    return None if ipaddress.ip_address(host).is_loopback else host


def not_ours(*hosts: str) -> tuple[str, ...]:
    """``hosts`` (documentation addresses), checked to be no address of this machine."""
    if any(is_local_address(h) for h in hosts):
        pytest.skip(f"this machine has one of {hosts}")
    return hosts


async def test_a_wildcard_node_leaves_out_every_address_of_this_machine_on_its_port() -> None:
    mine = this_machines_address()
    if mine is None:
        pytest.skip("this machine has no address but loopback")
    others = not_ours("203.0.113.7", "203.0.113.8")
    table = Table({"pool.example": Answer(found("127.0.0.7", mine, *others), 5)})
    wildcard = parse_host("0.0.0.0:17434")
    discovery = Discovery((POOL,), table, own=wildcard)
    await discovery.refresh(POOL)
    assert discovery.addresses() == addresses(*(f"{h}:17434" for h in others))  # loopback and `mine`: us
    bound = Discovery((POOL,), table, own=parse_host(f"{mine}:17434"))  # bound to that address only
    await bound.refresh(POOL)
    assert bound.addresses() == addresses("127.0.0.7:17434", *(f"{h}:17434" for h in others))
    assert not is_self(parse_host(f"{mine}:17435"), wildcard)  # another port is another node


async def test_a_node_named_by_a_name_leaves_out_that_names_addresses() -> None:
    name = socket.gethostname()
    try:
        mine = sorted({str(info[4][0]) for info in socket.getaddrinfo(name, 1, type=socket.SOCK_STREAM)})
    except OSError:
        pytest.skip(f"this machine's name {name!r} does not resolve")
    table = Table({"pool.example": Answer(found(*mine, *not_ours("203.0.113.7")), 5)})
    discovery = Discovery((POOL,), table, own=parse_host(f"{name}:17434"))
    await discovery.refresh(POOL)
    assert len(discovery.addresses()) == len(mine) + 1  # not known yet
    await discovery.learn_own()
    assert discovery.addresses() == addresses("203.0.113.7:17434")


def test_an_address_is_this_machines_when_a_socket_binds_to_it() -> None:
    assert is_local_address("127.0.0.1") and is_local_address("127.0.0.42")
    assert not is_local_address(not_ours("203.0.113.7")[0])  # TEST-NET-3
    assert not is_local_address("0.0.0.0") and not is_local_address("pool.example")
    assert is_self(parse_host("203.0.113.7:1"), parse_host("[::]:1"), local=lambda host: True)
    assert not is_self(parse_host("203.0.113.7:1"), parse_host("10.0.0.1:1"), local=lambda host: True)


async def test_a_name_is_followed_at_its_ttl_and_each_change_is_told(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "llmman.cluster")
    table = Table({"pool.example": Answer(found("10.0.0.1"), 30)})
    steps, told = Steps(), list[tuple[HostAddress, ...]]()
    discovery = Discovery((POOL,), table, sleep=steps)
    discovery.start(told.append)
    try:
        await until(lambda: len(steps.waits) == 1, "the first lookup")
        assert told == [addresses("10.0.0.1:17434")] and steps.waits == [30.0]
        steps.step()  # the same answer: nothing to tell
        await until(lambda: len(steps.waits) == 2, "the second lookup")
        assert len(told) == 1
        table.answers["pool.example"] = Answer(found("10.0.0.1", "10.0.0.2"), 0)
        steps.step()
        await until(lambda: len(told) == 2, "the grown set")
        assert told[-1] == addresses("10.0.0.1:17434", "10.0.0.2:17434")
        await until(lambda: len(steps.waits) == 3, "the third wait")
        assert steps.waits[-1] == MIN_TTL_S
        table.answers["pool.example"] = LookupFailed("SERVFAIL")
        for n in (4, 5):
            steps.step()
            await until(lambda n=n: len(steps.waits) == n, "a failed lookup")  # type: ignore[misc]
        assert len(told) == 2 and steps.waits[-2:] == [RETRY_S, RETRY_S]  # the last set is kept
        assert caplog.text.count("looking up pool.example:17434 failed (SERVFAIL)") == 1  # logged once
        table.answers["pool.example"] = Answer((), None)  # NXDOMAIN: no pod is ready
        steps.step()
        await until(lambda: len(told) == 3, "the emptied set")
        assert told[-1] == () and "pool.example:17434 resolves again" in caplog.text
    finally:
        await discovery.close()


# -- the set changing under Peers --------------------------------------------------------------------


class Node:
    """A loopback peer whose ``/llmman/node`` answers ``doc``; ``hits`` counts the fetches."""

    def __init__(self, address: HostAddress, doc: dict[str, object]) -> None:
        self.address, self.doc, self.hits = address, doc, 0


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Node]]]:
    runners: list[web.AppRunner] = []

    async def start(**extra: object) -> Node:
        node = Node(HostAddress("http", "127.0.0.1", 0),
                    {"memory": 1000, "loaded": {}, "stored": {}, "name": "n", **extra})

        async def answer(_: web.Request) -> web.Response:
            node.hits += 1
            return web.json_response(node.doc)

        app = web.Application()
        app.router.add_get("/llmman/node", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        node.address = HostAddress("http", "127.0.0.1", runner.addresses[0][1])
        return node

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_peers_grow_and_shrink_with_the_set(serve: Callable[..., Awaitable[Node]]) -> None:
    b, c = await serve(), await serve()
    async with aiohttp.ClientSession() as session:
        peers = Peers(session, (b.address,), refresh=0.05, retry=60)
        peers.start()
        try:
            await until(lambda: b.hits > 0, "b's first refresh")
            peers.update((b.address, c.address))
            await until(lambda: c.hits > 0, "the refresh of c, which came with the set")
            assert [s.address for s in peers.states()] == [b.address, c.address]
            await until(lambda: all(s.seen is not None for s in peers.states()), "both seen")
            assert {v.name for v in await peers.current()} == {peer_name(b.address), peer_name(c.address)}

            peers.update((c.address,))
            assert [s.address for s in peers.states()] == [c.address] and peers.up() == [c.address]
            assert [v.name for v in await peers.current()] == [peer_name(c.address)]
            hits = b.hits
            await until(lambda: c.hits > hits + 3, "a few more refreshes of c")
            assert b.hits <= hits + 1  # b's refresh stopped (one fetch may have been out)
            peers.mark_down(b.address, "gone")  # a late failure of a removed peer is not kept
            assert peers.up() == [c.address]

            peers.update(())
            assert not peers and peers.states() == []
        finally:
            await peers.close()


async def test_a_peer_answering_with_this_nodes_id_is_left_out(serve: Callable[..., Awaitable[Node]],
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "llmman.cluster")
    me, other = await serve(id="abc123"), await serve(id="fff")
    async with aiohttp.ClientSession() as session:
        peers = Peers(session, (me.address, other.address), refresh=0, node_id="abc123")
        views = await peers.current()
        assert [v.name for v in views] == [peer_name(other.address)]
        assert peers.addresses == (other.address,)
        peers.update((me.address, other.address))  # the next lookup names it again: still left out
        assert peers.addresses == (other.address,) and me.address not in peers.up()
        assert "is this node itself (its node id)" in caplog.text
        await peers.close()


# -- TLS to an address, verified as the name -----------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
async def test_an_https_peer_found_by_address_is_verified_as_its_name(tmp_path: Path) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
             "-subj", "/CN=test CA", "-keyout", "ca.key", "-out", "ca.pem", cwd=tmp_path)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=peer",
             "-keyout", "node.key", "-out", "node.csr", cwd=tmp_path)
    (tmp_path / "ext.cnf").write_text("subjectAltName=DNS:peer.pool.example\n")  # the name, no IP
    _openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", "ext.cnf", "-out", "node.pem", cwd=tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "node.pem", tmp_path / "node.key")
    hosts: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        hosts.append(request.headers["Host"])
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/llmman/node", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx).start()
    port = runner.addresses[0][1]
    names = ServerNames()
    client_ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    url = f"https://127.0.0.1:{port}/llmman/node"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx),
                                         middlewares=(names,)) as session:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):  # by address alone: no match
                await session.get(url)
            names.set({("127.0.0.1", port): "peer.pool.example"})
            async with session.get(url) as response:
                assert response.status == 200
            assert hosts == [f"peer.pool.example:{port}"]
    finally:
        await runner.cleanup()
