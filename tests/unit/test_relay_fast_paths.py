"""The relay's cheap ways for one event a read (issue 17) give what the general ways give.

:class:`~llmman.protocol.framing.SSEDecoder` decodes a chunk of whole one-line ``data:`` events without
cutting lines, :class:`~llmman.protocol.model_echo.ModelEcho` rewrites a chunk ending in a newline with one
replace, :class:`~llmman.protocol.ollama.timestamps.CreatedAt` formats Ollama's stamp once a millisecond,
and :class:`~llmman.cluster.forward.WatchedAnswer` watches a peer's silences with a timer per
stall interval: each is checked against the general way (byte-by-byte decoding never takes the fast
path; ``bytes.replace`` of the whole stream; :func:`~llmman.cluster.forward.next_chunk`'s rule).
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime
from typing import cast

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmman.cluster.forward import PeerSilent, WatchedAnswer
from llmman.protocol.framing import SSEDecoder, SSEEvent
from llmman.protocol.model_echo import ModelEcho, model_field
from llmman.protocol.ollama.timestamps import CreatedAt, stamp

STALL = 0.01  # seconds: the tests wait on probes being asked, never on the clock

_data = st.text(alphabet=st.sampled_from('ab {}":\u00e9\u4e16\r\n'), max_size=12)
_event = st.one_of(
    _data.map(lambda d: b"data: " + d.encode() + b"\n\n"),  # mostly the one-line events llama-server sends
    _data.map(lambda d: b"data:" + d.encode() + b"\n\n"),
    _data.map(lambda d: b"event: e\ndata: " + d.encode() + b"\n\n"),
    st.just(b": ping\n\n"), st.just(b"data: [DONE]\n\n"), st.just(b"\n"), st.just(b"data: a\r\n\r\n"),
)


def slow(stream: bytes) -> list[SSEEvent]:
    """The general way: one byte a feed (a one-byte chunk never ends in a blank line)."""
    decoder = SSEDecoder()
    out = [event for i in range(len(stream)) for event in decoder.feed(stream[i:i + 1])]
    return out + decoder.close()


@given(st.lists(_event, max_size=8), st.lists(st.integers(min_value=0, max_value=200), max_size=4))
def test_sse_chunks_of_whole_events_decode_as_byte_by_byte(events: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(events)
    at = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    decoder = SSEDecoder()
    got = [event for a, b in itertools.pairwise(at) for event in decoder.feed(stream[a:b])]
    assert got + decoder.close() == slow(stream)


def test_the_fast_path_takes_one_line_data_events_and_leaves_the_rest() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a":1}\n\ndata: [DONE]\n\n') == [SSEEvent(None, '{"a":1}'),
                                                                  SSEEvent(None, "[DONE]")]
    assert decoder._whole_data_events(b"event: x\ndata: y\n\n") == []
    assert decoder.feed(b"data: half") == []
    assert decoder._whole_data_events(b"data: z\n\n") == []  # a partial line is pending
    assert decoder.feed(b"\n\n") == [SSEEvent(None, "half")]


OLD = model_field("docker.io/ai/smollm2:135m")
NEW = model_field("smollm2:135m")
_piece = st.sampled_from([b'data: {"model":"docker.io/ai/smollm2:135m","x":1}\n\n', b"\n",
                          b'"model":"docker.io', b'/ai/smollm2:135m"', b"data: [DONE]\n\n",
                          b'"model":"other"\n'])


@given(st.lists(_piece, max_size=10), st.lists(st.integers(min_value=0, max_value=400), max_size=5))
def test_the_echo_of_any_cut_stream_is_the_whole_replace(pieces: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(pieces)
    at = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    echo = ModelEcho(OLD, NEW)
    got = b"".join(echo.feed(stream[a:b]) for a, b in itertools.pairwise(at)) + echo.flush()
    assert got == stream.replace(OLD, NEW)


def test_an_old_name_holding_a_newline_takes_the_general_way() -> None:
    echo = ModelEcho(b"a\nb", b"X")
    assert echo.feed(b"1a\n") == b"1"
    assert echo.feed(b"b2\n") + echo.flush() == b"X2\n"


class _Protocol:
    """What an aiohttp StreamReader asks of its protocol (flow control), for a reader fed by the test."""

    connected = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


class Probes:
    """``alive()`` answering from a list (then True), counting the questions; ``asked`` is an event per
    question so a test waits on the probe, not on the clock."""

    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)
        self.asked = 0
        self.event = asyncio.Event()

    async def __call__(self) -> bool:
        self.asked += 1
        self.event.set()
        return self.answers.pop(0) if self.answers else True


def reader() -> aiohttp.StreamReader:
    return aiohttp.StreamReader(cast(aiohttp.client_proto.ResponseHandler, _Protocol()), 2**16,
                                loop=asyncio.get_running_loop())


async def test_a_silent_peer_is_given_up_only_when_its_probe_fails() -> None:
    content = reader()
    content.feed_data(b"first")
    probes = Probes(True, False)
    answer = WatchedAnswer(content, probes, STALL, what="peer p silent mid-answer")
    try:
        assert await answer.next() == b"first"
        with pytest.raises(PeerSilent, match=r"peer p silent mid-answer for 0\.01 s and not answering"):
            await answer.next()
        assert probes.asked == 2
    finally:
        answer.close()


async def test_a_silent_peer_that_answers_its_probe_is_waited_for() -> None:
    content = reader()
    probes = Probes(True, True)
    answer = WatchedAnswer(content, probes, STALL, what="silent")
    try:
        reading = asyncio.ensure_future(answer.next())
        while probes.asked < 2:
            probes.event.clear()
            await probes.event.wait()
        assert not reading.done()
        content.feed_data(b"late")
        assert await reading == b"late"
        content.feed_eof()
        assert await answer.next() == b""
    finally:
        answer.close()


async def test_time_spent_sending_is_not_silence_and_a_closed_watch_never_asks() -> None:
    content = reader()
    probes = Probes(False)
    answer = WatchedAnswer(content, probes, STALL, what="silent")
    await asyncio.sleep(STALL * 5)  # the relay is sending to a slow client meanwhile: no read waits
    assert probes.asked == 0
    content.feed_data(b"x")
    assert await answer.next() == b"x"
    answer.close()
    reading = asyncio.ensure_future(answer.next())
    await asyncio.sleep(STALL * 5)
    assert probes.asked == 0 and not reading.done()
    content.feed_eof()
    assert await reading == b""


async def test_no_stall_never_asks() -> None:
    content = reader()
    probes = Probes(False)
    answer = WatchedAnswer(content, probes, 0, what="silent")
    reading = asyncio.ensure_future(answer.next())
    await asyncio.sleep(STALL * 3)
    assert probes.asked == 0
    content.feed_eof()
    assert await reading == b""
    answer.close()


def test_created_at_is_made_once_a_millisecond_in_isoformats_shape() -> None:
    now = [1_764_638_400_123_456_789]
    clock = CreatedAt(lambda: now[0])
    first = clock()
    assert first == "2025-12-02T01:20:00.123000Z"
    assert first == datetime.fromtimestamp(1_764_638_400.123, UTC).isoformat().replace("+00:00", "Z")
    now[0] += 500_000  # the same millisecond
    assert clock() is first
    now[0] += 1_000_000
    assert clock() == "2025-12-02T01:20:00.124000Z"
    assert stamp(1_764_638_401_000) == "2025-12-02T01:20:01Z"  # as isoformat at a whole second


async def test_a_failed_probe_about_a_read_that_has_ended_keeps_watching() -> None:
    content = reader()
    gate = asyncio.Event()
    asked = asyncio.Event()
    answers = [False, False]
    count = 0

    async def alive() -> bool:
        nonlocal count
        count += 1
        asked.set()
        if count == 1:
            await gate.wait()  # the peer's bytes arrive while this probe is out
        return answers.pop(0) if answers else True

    answer = WatchedAnswer(content, alive, STALL, what="silent")
    try:
        reading = asyncio.ensure_future(answer.next())
        await asyncio.wait_for(asked.wait(), 5)
        content.feed_data(b"late")
        assert await reading == b"late"  # the read ended before the probe said no: nothing given up
        gate.set()
        with pytest.raises(PeerSilent):  # the watch goes on: the next silent read is probed and given up
            await asyncio.wait_for(answer.next(), 5)
        assert count == 2
    finally:
        answer.close()
