"""SSE and NDJSON framing: byte-level decoding that survives arbitrary network chunking."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmman.protocol.framing import (
    SSE_DONE,
    FrameError,
    NDJSONDecoder,
    SSEDecoder,
    SSEEvent,
    ndjson,
    parse_data,
    sse,
)

DATA = Path(__file__).parent / "data"
TEXTS = ["é", "日本", "🦙", "naïve 日本語 🦙🦙 ok", "\u00a0x\u2028y"]


def _sse_all(chunks: list[bytes]) -> list[SSEEvent]:
    dec = SSEDecoder()
    out = [ev for chunk in chunks for ev in dec.feed(chunk)]
    return out + dec.close()


def _ndjson_all(chunks: list[bytes]) -> list[object]:
    dec = NDJSONDecoder()
    out = [obj for chunk in chunks for obj in dec.feed(chunk)]
    return out + dec.close()


@pytest.mark.parametrize("text", TEXTS)
def test_sse_multibyte_split_at_every_offset(text: str) -> None:
    wire = sse({"content": text})
    for cut in range(len(wire) + 1):
        events = _sse_all([wire[:cut], wire[cut:]])
        assert [parse_data(ev) for ev in events] == [{"content": text}], cut


@pytest.mark.parametrize("text", TEXTS)
def test_ndjson_multibyte_split_at_every_offset(text: str) -> None:
    wire = ndjson({"response": text}) + ndjson({"done": True})
    for cut in range(len(wire) + 1):
        assert _ndjson_all([wire[:cut], wire[cut:]]) == [{"response": text}, {"done": True}], cut


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        (b"data: a\n\n", [SSEEvent(None, "a")]),
        (b"data: a\r\n\r\n", [SSEEvent(None, "a")]),
        (b"data: a\r\rdata: b\r\r", [SSEEvent(None, "a"), SSEEvent(None, "b")]),
        (b": ping\n\ndata: a\n\n: ping\n\n", [SSEEvent(None, "a")]),
        (b"data: one\ndata: two\n\n", [SSEEvent(None, "one\ntwo")]),
        (b"data:nospace\n\n", [SSEEvent(None, "nospace")]),
        (b"data:  two spaces\n\n", [SSEEvent(None, " two spaces")]),
        (b"data\n\n", [SSEEvent(None, "")]),
        (b"event: response.created\ndata: {}\n\n", [SSEEvent("response.created", "{}")]),
        (b"event: x\n\ndata: y\n\n", [SSEEvent(None, "y")]),  # event without data: dropped, name reset
        (b"id: 7\nretry: 10\ndata: z\n\n", [SSEEvent(None, "z")]),
        (b"\xef\xbb\xbfdata: bom\n\n", [SSEEvent(None, "bom")]),
        (b"data: unterminated", [SSEEvent(None, "unterminated")]),
        (b"data: half\n", [SSEEvent(None, "half")]),
        (b"data: cr\r", [SSEEvent(None, "cr")]),
        (b"", []),
        (b"\n\n\n", []),
    ],
)
def test_sse_decoder_table(wire: bytes, expected: list[SSEEvent]) -> None:
    assert _sse_all([wire]) == expected
    assert _sse_all([wire[i : i + 1] for i in range(len(wire))]) == expected


def test_sse_crlf_split_between_cr_and_lf_is_one_line_end() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r") == []
    assert dec.feed(b"\n\r") == []
    assert dec.feed(b"\n") == [SSEEvent(None, "a")]
    assert dec.close() == []


def test_sse_invalid_utf8_in_complete_line_is_replaced_not_raised() -> None:
    assert _sse_all([b"data: \xff\n\n"]) == [SSEEvent(None, "\ufffd")]


@pytest.mark.parametrize("path", sorted(DATA.glob("llama_*.txt")), ids=lambda p: p.name)
def test_recorded_streams_decode_the_same_byte_by_byte(path: Path) -> None:
    wire = path.read_bytes()
    whole = _sse_all([wire])
    assert whole
    assert _sse_all([wire[i : i + 1] for i in range(len(wire))]) == whole
    assert _sse_all([wire[i : i + 7] for i in range(0, len(wire), 7)]) == whole


@pytest.mark.parametrize(
    ("data", "expected"),
    [("[DONE]", None), (" [DONE] ", None), ('{"a": 1}', {"a": 1})],
)
def test_parse_data(data: str, expected: object) -> None:
    assert parse_data(SSEEvent(None, data)) == expected


@pytest.mark.parametrize("data", ["{", "[1]", "3", "", "null"])
def test_parse_data_rejects_non_objects(data: str) -> None:
    with pytest.raises(FrameError):
        parse_data(SSEEvent(None, data))


@pytest.mark.parametrize(
    ("obj", "event", "wire"),
    [
        ({"a": 1}, None, b'data: {"a":1}\n\n'),
        ("[DONE]", None, SSE_DONE),
        ("x\ny", None, b"data: x\ndata: y\n\n"),
        ({"t": "é"}, "message_start", 'event: message_start\ndata: {"t":"é"}\n\n'.encode()),
    ],
)
def test_sse_encoder(obj: object, event: str | None, wire: bytes) -> None:
    assert sse(obj, event) == wire


def test_sse_encoder_round_trips_through_decoder() -> None:
    events = [SSEEvent("a", "x\ny"), SSEEvent(None, '{"k":"日本"}'), SSEEvent("b", "")]
    wire = b"".join(sse(ev.data, ev.event) for ev in events)
    assert _sse_all([wire]) == events


@pytest.mark.parametrize("obj", [{"a": "x\ny"}, {"e": "🦙"}, [1, 2], "s", {"n": None, "f": 1.5}])
def test_ndjson_is_one_line_with_one_newline(obj: object) -> None:
    wire = ndjson(obj)
    assert wire.endswith(b"\n") and wire.count(b"\n") == 1
    assert orjson.loads(wire) == obj


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        (b'{"a":1}\n{"b":2}\n', [{"a": 1}, {"b": 2}]),
        (b'{"a":1}\r\n{"b":2}\r\n', [{"a": 1}, {"b": 2}]),
        (b'{"a":1}\n\n  \n{"b":2}', [{"a": 1}, {"b": 2}]),
        (b"", []),
    ],
)
def test_ndjson_decoder_table(wire: bytes, expected: list[object]) -> None:
    assert _ndjson_all([wire]) == expected
    assert _ndjson_all([wire[i : i + 1] for i in range(len(wire))]) == expected


@pytest.mark.parametrize("wire", [b"not json\n", b'{"a":1}\n{"b"'])
def test_ndjson_decoder_rejects_bad_lines(wire: bytes) -> None:
    with pytest.raises(FrameError):
        _ndjson_all([wire])


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(
    objs=st.lists(st.dictionaries(st.text(max_size=5), _json_values, max_size=4), max_size=5),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=8),
)
def test_any_chunking_round_trips(objs: list[dict[str, object]], cuts: list[int]) -> None:
    sse_wire = b"".join(sse(o) for o in objs)
    nd_wire = b"".join(ndjson(o) for o in objs)
    for wire, decode in ((sse_wire, lambda c: [parse_data(e) for e in _sse_all(c)]), (nd_wire, _ndjson_all)):
        points = sorted({c % (len(wire) + 1) for c in cuts} | {0, len(wire)})
        chunks = [wire[a:b] for a, b in itertools.pairwise(points)]
        assert decode(chunks) == objs
