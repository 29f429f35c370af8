"""What a forward sends a peer (cluster/forward.py): only the client headers a peer needs, the hop mark
naming this node; and the silence check (:func:`watched`, :func:`next_chunk`): a silent peer that answers
its probe is waited for, one that does not is given up, and an answer arriving meanwhile is taken."""

from __future__ import annotations

import asyncio
from typing import cast

import aiohttp
import pytest

from llmman.cluster.forward import (
    PeerSilent,
    answers_probe,
    forward_headers,
    header_value,
    next_chunk,
    watched,
)
from llmman.cluster.peers import HOP, Peers
from llmman.config.table import parse_host

CLIENT = [
    ("Content-Type", "application/json"), ("Accept", "text/event-stream"), ("User-Agent", "anthropic-py"),
    ("anthropic-version", "2023-06-01"), ("Cookie", "session=secret"), ("Proxy-Authorization", "Basic x"),
    ("Authorization", "Bearer client-key"), ("x-api-key", "client-key"), ("x-goog-api-key", "k"),
    ("Host", "front:17434"), ("Connection", "keep-alive"), ("Transfer-Encoding", "chunked"),
    ("x-llmman-source", "http://evil:1"), ("x-llmman-source-digest", "sha256:" + "0" * 64),
    ("X-Forwarded-For", "10.0.0.1"), ("Accept-Encoding", "gzip"), ("x-llmman-hop", "client-made"),
]

STALL = 0.01  # seconds: the tests wait on probes being asked, never on the clock


def peers(key: str = "peer-key") -> Peers:
    return Peers(cast(aiohttp.ClientSession, None), (), api_key=key)


def test_cookies_credentials_and_hop_by_hop_headers_stay_here() -> None:
    sent = {k.lower(): v for k, v in forward_headers(CLIENT, peers(), node="front-a").items()}
    assert sent == {
        "content-type": "application/json", "accept": "text/event-stream", "user-agent": "anthropic-py",
        "anthropic-version": "2023-06-01", HOP: "front-a", "authorization": "Bearer peer-key",
        "accept-encoding": "identity",
    }


def test_the_hop_mark_without_a_node_name_is_the_seeds() -> None:
    assert forward_headers(CLIENT, peers())[HOP] == "1"


def test_the_copy_source_is_ours_never_the_clients() -> None:
    sent = forward_headers(CLIENT, peers(""), "http://127.0.0.2:17434", "sha256:" + "a" * 64)
    assert sent["x-llmman-source"] == "http://127.0.0.2:17434"
    assert sent["x-llmman-source-digest"] == "sha256:" + "a" * 64
    assert "authorization" not in {k.lower() for k in sent}


@pytest.mark.parametrize(("name", "value"), [
    ("spark", "spark"), ("rack 2/node-7", "rack 2/node-7"),
    ("evil\r\nSet-Cookie: x=1", "evil%0D%0ASet-Cookie: x=1"), ("café", "caf%C3%A9"), ("100%", "100%25"),
    ("  ", "?"),
])
def test_a_node_name_is_always_a_safe_header_value(name: str, value: str) -> None:
    assert header_value(name) == value
    assert all(" " <= c <= "~" for c in header_value(name))


class Probes:
    """An ``alive()`` whose answers the test gives, counting the times it was asked."""

    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)
        self.asked = 0
        self.called = asyncio.Event()

    async def __call__(self) -> bool:
        self.asked += 1
        self.called.set()
        return self.answers.pop(0) if self.answers else True

    async def until_asked(self, times: int) -> None:
        while self.asked < times:
            self.called.clear()
            await self.called.wait()


async def test_a_silent_peer_that_answers_its_probe_is_waited_for() -> None:
    probes = Probes(True, True, True)
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def work() -> str:
        return await answer

    waiting = asyncio.ensure_future(watched(work(), probes, STALL, what="silent"))
    await probes.until_asked(3)  # three stall intervals passed, each probe answered
    assert not waiting.done()
    answer.set_result("status line")
    assert await waiting == "status line"


async def test_a_silent_peer_that_fails_its_probe_is_given_up_and_its_work_cancelled() -> None:
    cancelled = asyncio.Event()

    async def work() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return "never"

    with pytest.raises(PeerSilent, match=r"silent before answering for 0\.01 s and not answering its probe"):
        await watched(work(), Probes(True, False), STALL, what="silent before answering")
    assert cancelled.is_set()


async def test_an_answer_arriving_during_the_probe_is_taken() -> None:
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    probing = asyncio.Event()

    async def slow_probe() -> bool:
        probing.set()
        await asyncio.Event().wait()  # a probe that would take its whole timeout
        return False

    async def work() -> str:
        return await answer

    waiting = asyncio.ensure_future(watched(work(), slow_probe, STALL, what="silent"))
    await probing.wait()
    answer.set_result("status line")
    assert await waiting == "status line"


async def test_an_answer_that_comes_as_the_wait_is_cancelled_is_discarded() -> None:
    """The client leaves (the forward is cancelled) just as the peer's status line arrives: the response
    is handed to ``discard`` (closed), not leaked."""
    discarded: list[str] = []
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def work() -> str:
        return await answer

    waiting = asyncio.ensure_future(watched(work(), Probes(), 60.0, what="silent", discard=discarded.append))
    await asyncio.sleep(0)  # it is now waiting on the work
    answer.set_result("status line")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert discarded == ["status line"]


async def test_no_stall_check_waits_without_asking() -> None:
    probes = Probes(False)

    async def work() -> str:
        await asyncio.sleep(STALL * 3)
        return "done"

    assert await watched(work(), probes, 0, what="silent") == "done"
    assert probes.asked == 0


async def test_a_stalled_stream_is_given_up_only_when_the_probe_fails() -> None:
    content = aiohttp.StreamReader(cast(aiohttp.client_proto.ResponseHandler, _Protocol()), 2**16,
                                   loop=asyncio.get_running_loop())
    content.feed_data(b"first")
    probes = Probes(True, False)
    assert await next_chunk(content, probes, STALL, what="silent mid-answer") == b"first"
    assert probes.asked == 0
    reading = asyncio.ensure_future(next_chunk(content, probes, STALL, what="silent mid-answer"))
    with pytest.raises(PeerSilent, match="silent mid-answer"):
        await reading
    assert probes.asked == 2
    content.feed_data(b"second")  # nothing was lost by the cancelled reads
    content.feed_eof()
    assert await next_chunk(content, Probes(), STALL, what="silent mid-answer") == b"second"
    assert await next_chunk(content, Probes(), STALL, what="silent mid-answer") == b""


class _Protocol:
    """What an aiohttp StreamReader asks of its protocol (flow control), for a reader fed by the test."""

    connected = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


async def test_a_peer_already_marked_down_is_not_probed_again() -> None:
    address = parse_host("127.0.0.9:17500")
    # No session: a probe would fail with AttributeError, so a False here was decided without one.
    pool = Peers(cast(aiohttp.ClientSession, None), (address,), api_key="k", retry=3600)
    pool.mark_down(address, "its state did not answer")
    try:
        assert await answers_probe(pool, address) is False
    finally:
        await pool.close()
