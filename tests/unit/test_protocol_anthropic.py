"""Table tests of the Anthropic translation (protocol/anthropic.py) with a recorded llama-server stream."""

from __future__ import annotations

import orjson
import pytest

from llmman.errors import BadRequest
from llmman.protocol.anthropic.messages import (
    AnthropicStream,
    fix_message,
    prepare_request,
    starts_with_message_start,
    upstream_error,
)
from llmman.protocol.framing import SSEDecoder

# Recorded from llama-server b11434 /v1/messages (SmolLM2-135M), with a multi-byte text delta added.
RECORDED = (
    'event: message_start\ndata: {"type":"message_start","message":{"id":"chatcmpl-NFsp","type":"message",'
    '"role":"assistant","content":[],"model":"/m/SmolLM2.gguf","stop_reason":null,"stop_sequence":null,'
    '"usage":{"cache_read_input_tokens":0,"input_tokens":31,"output_tokens":0}}}\n\n'
    'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    '"content_block":{"type":"text","text":""}}\n\n'
    'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    '"delta":{"type":"text_delta","text":"Héllo ✓"}}\n\n'
    'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    '"delta":{"type":"text_delta","text":""}}\n\n'
    'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tokens",'
    '"stop_sequence":null},"usage":{"output_tokens":8}}\n\n'
    'event: message_stop\ndata: {"type":"message_stop"}\n\n'
).encode()


def _run(chunks: list[bytes], model: str = "smollm2:135m") -> list[tuple[str, dict[str, object]]]:
    decoder, stream, out = SSEDecoder(), AnthropicStream(model), b""
    for chunk in chunks:
        for event in decoder.feed(chunk):
            out += stream.feed(event)
    for event in decoder.close():
        out += stream.feed(event)
    out += stream.close()
    events = SSEDecoder().feed(out)
    return [(e.event or "", orjson.loads(e.data)) for e in events]


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(RECORDED)])
def test_recorded_stream_any_chunking(size: int) -> None:
    events = _run([RECORDED[i:i + size] for i in range(0, len(RECORDED), size)])
    names = [n for n, _ in events]
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta",
                     "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    message = events[0][1]["message"]
    assert isinstance(message, dict)
    assert message["id"] == "msg_NFsp" and message["model"] == "smollm2:135m"
    assert events[3][1]["delta"] == {"type": "text_delta", "text": "Héllo ✓"}
    assert all(n == d["type"] for n, d in events)


def _first_event_dropped() -> bytes:
    return RECORDED[RECORDED.index(b"event: content_block_start"):]


@pytest.mark.parametrize("size", [1, 5, len(RECORDED)])
def test_a_stream_without_message_start_gets_ours_and_a_ping_first(size: int) -> None:
    """llama-server under load sometimes sends no message_start: llmman's goes first, once."""
    data = _first_event_dropped()
    events = _run([data[i:i + size] for i in range(0, len(data), size)])
    assert [n for n, _ in events][:3] == ["message_start", "ping", "content_block_start"]
    message = events[0][1]["message"]
    assert message == {"id": "msg_local", "type": "message", "role": "assistant", "content": [],
                       "model": "smollm2:135m", "stop_reason": None, "stop_sequence": None,
                       "usage": {"input_tokens": 0, "output_tokens": 0}}
    assert [n for n, _ in events].count("message_start") == 1 and events[-1][0] == "message_stop"


def test_the_route_can_tell_a_missing_start_from_the_first_bytes_and_give_its_count() -> None:
    assert starts_with_message_start(RECORDED[:20]) is None  # the first event is not whole yet
    assert starts_with_message_start(RECORDED) is True
    assert starts_with_message_start(_first_event_dropped()) is False
    stream = AnthropicStream("m", message_id="msg_x")
    stream.input_tokens = 31
    out = SSEDecoder().feed(stream.feed(SSEDecoder().feed(_first_event_dropped())[0]))
    assert orjson.loads(out[0].data)["message"]["usage"] == {"input_tokens": 31, "output_tokens": 0}
    assert orjson.loads(out[0].data)["message"]["id"] == "msg_x"


def test_a_late_message_start_is_dropped_and_its_input_tokens_ride_on_message_delta() -> None:
    at_block = RECORDED.index(b"event: content_block_start")
    at_delta = RECORDED.index(b"event: content_block_delta")
    start, block, rest = RECORDED[:at_block], RECORDED[at_block:at_delta], RECORDED[at_delta:]
    events = _run([block + start + rest])
    names = [n for n, _ in events]
    assert names.count("message_start") == 1 and names[:2] == ["message_start", "ping"]
    (delta,) = [d for n, d in events if n == "message_delta"]
    assert delta["usage"] == {"cache_read_input_tokens": 0, "input_tokens": 31, "output_tokens": 8}


def test_stream_cut_before_message_stop_ends_with_error_event() -> None:
    events = _run([RECORDED[: RECORDED.index(b"event: content_block_stop")]])
    assert events[-1][0] == "error"
    assert events[-1][1] == {"type": "error", "error": {
        "type": "api_error", "message": "the model's answer ended before message_stop"}}


def test_upstream_error_event_reshaped_and_malformed_dropped() -> None:
    error = b'data: {"error":{"code":500,"message":"boom","type":"server_error"}}\n\n'
    events = _run([b"data: not json\n\n", error])
    assert events == [("error", {"type": "error", "error": {"type": "api_error", "message": "boom"}})]


def test_prepare_request_moves_system_messages() -> None:
    body, model = prepare_request({
        "model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "A"}],
        "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "B"},
                     {"role": "assistant", "content": [{"type": "text", "text": "x"}]}],
        "tools": [{"name": "t", "input_schema": {}}], "stop_sequences": ["\n"],
    })
    assert model == "m" and body["system"] == "A\n\nB"
    assert body["messages"] == [{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": [{"type": "text", "text": "x"}]}]
    assert body["tools"] == [{"name": "t", "input_schema": {}}] and body["stop_sequences"] == ["\n"]


@pytest.mark.parametrize("body", [
    None, [], {"messages": []}, {"model": "", "messages": []}, {"model": "m"}, {"model": "m", "messages": {}},
    {"model": "m", "messages": [1]}, {"model": "m", "messages": [{"role": "user", "content": 3}]},
    {"model": "m", "messages": [], "max_tokens": 0}, {"model": "m", "messages": [], "max_tokens": True},
    {"model": "m", "messages": [], "stream": "yes"}, {"model": "m", "messages": [], "system": 5},
])
def test_prepare_request_rejects(body: object) -> None:
    with pytest.raises(BadRequest):
        prepare_request(body)


def test_fix_message_and_upstream_errors() -> None:
    assert fix_message({"id": "chatcmpl-abc", "model": "/x.gguf", "content": []}, "m") == {
        "id": "msg_abc", "model": "m", "content": []}
    body = b'{"error":{"code":500,"message":"image input is not supported - hint","type":"server_error"}}'
    assert upstream_error(500, body) == (400, {"type": "error", "error": {
        "type": "invalid_request_error", "message": "image input is not supported - hint"}})
    assert upstream_error(503, b"Loading")[1]["error"] == {"type": "overloaded_error", "message": "Loading"}


# Recorded from llama-server b11434 /v1/messages with a thinking template (SmolLM2 with a ``<think>``
# generation prompt), ``thinking: {type: enabled, budget_tokens: 3}``: the thinking budget runs out, the text
# block opens while the thinking block is still open, and both are closed only at the end.
THINKING = (
    'event: message_start\ndata: {"type":"message_start","message":{"id":"chatcmpl-1JvFgHov",'
    '"type":"message","role":"assistant","content":[],"model":"smolthink","stop_reason":null,"stop_sequence":null,'
    '"usage":{"cache_read_input_tokens":13,"input_tokens":1,"output_tokens":0}}}\n\n'
    'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    '"content_block":{"type":"thinking","thinking":""}}\n\n'
    'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    '"delta":{"type":"thinking_delta","thinking":"\\nI pense à ✓"}}\n\n'
    'event: content_block_start\ndata: {"type":"content_block_start","index":1,'
    '"content_block":{"type":"text","text":""}}\n\n'
    'event: content_block_delta\ndata: {"type":"content_block_delta","index":1,'
    '"delta":{"type":"text_delta","text":"I"}}\n\n'
    'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    '"delta":{"type":"signature_delta","signature":""}}\n\n'
    'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    'event: content_block_stop\ndata: {"type":"content_block_stop","index":1}\n\n'
    'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tokens",'
    '"stop_sequence":null},"usage":{"output_tokens":8}}\n\n'
    'event: message_stop\ndata: {"type":"message_stop"}\n\n'
).encode()


def _shape(events: list[tuple[str, dict[str, object]]]) -> list[tuple[object, ...]]:
    """(event, index, block or delta type) for each event."""
    out: list[tuple[object, ...]] = []
    for name, data in events:
        inner = data.get("content_block") or data.get("delta")
        out.append((name, data.get("index"), inner.get("type") if isinstance(inner, dict) else None))
    return out


@pytest.mark.parametrize("size", [1, 5, 64, len(THINKING)])
def test_thinking_then_text_blocks_come_one_after_the_other(size: int) -> None:
    """As Anthropic streams them: thinking_delta..., signature_delta, stop 0, then the text block."""
    events = _run([THINKING[i:i + size] for i in range(0, len(THINKING), size)])
    assert _shape(events) == [
        ("message_start", None, None), ("ping", None, None),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert events[3][1]["delta"] == {"type": "thinking_delta", "thinking": "\nI pense à ✓"}
    assert events[4][1]["delta"] == {"type": "signature_delta", "signature": ""}


def test_thinking_block_without_signature_gets_one_and_open_block_closes_at_message_delta() -> None:
    stream = (
        b'data: {"type":"message_start","message":{"id":"chatcmpl-x","content":[]}}\n\n'
        b'data: {"type":"content_block_start","index":0,'
        b'"content_block":{"type":"thinking","thinking":""}}\n\n'
        b'data: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"thinking_delta","thinking":"hm"}}\n\n'
        b'data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":1}}\n\n'
        b'data: {"type":"content_block_stop","index":0}\n\n'
        b'data: {"type":"message_stop"}\n\n'
    )
    assert [(n, i, t) for n, i, t in _shape(_run([stream]))] == [
        ("message_start", None, None), ("ping", None, None), ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"), ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None), ("message_delta", None, None), ("message_stop", None, None),
    ]


def test_text_then_tool_use_blocks_are_sequential_too() -> None:
    stream = (
        b'data: {"type":"message_start","message":{"id":"chatcmpl-y","content":[]}}\n\n'
        b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
        b'data: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"Let me check."}}\n\n'
        b'data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"call_1",'
        b'"name":"get_weather","input":{}}}\n\n'
        b'data: {"type":"content_block_delta","index":1,'
        b'"delta":{"type":"input_json_delta","partial_json":"{\\"c"}}\n\n'
        b'data: {"type":"content_block_delta","index":1,'
        b'"delta":{"type":"input_json_delta","partial_json":"ity\\":1}"}}\n\n'
        b'data: {"type":"content_block_stop","index":0}\n\n'
        b'data: {"type":"content_block_stop","index":1}\n\n'
        b'data: {"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}\n\n'
        b'data: {"type":"message_stop"}\n\n'
    )
    assert _shape(_run([stream]))[2:9] == [
        ("content_block_start", 0, "text"), ("content_block_delta", 0, "text_delta"),
        ("content_block_stop", 0, None), ("content_block_start", 1, "tool_use"),
        ("content_block_delta", 1, "input_json_delta"), ("content_block_delta", 1, "input_json_delta"),
        ("content_block_stop", 1, None),
    ]


def test_a_matched_stop_sequence_is_stop_reason_stop_sequence() -> None:
    answer = {"id": "chatcmpl-z", "stop_reason": "end_turn", "stop_sequence": "."}
    assert fix_message(answer, "m")["stop_reason"] == "stop_sequence"
    assert fix_message({**answer, "stop_sequence": None}, "m")["stop_reason"] == "end_turn"
    stream = (b'data: {"type":"message_start","message":{"id":"chatcmpl-z","content":[]}}\n\n'
              b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":"!"},'
              b'"usage":{"output_tokens":3}}\n\n'
              b'data: {"type":"message_stop"}\n\n')
    delta = next(d for n, d in _run([stream]) if n == "message_delta")
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "!"}
