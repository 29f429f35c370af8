"""Table tests of the Anthropic translation (protocol/anthropic.py) with a recorded llama-server stream."""

from __future__ import annotations

import orjson
import pytest

from llmman.errors import BadRequest
from llmman.protocol.anthropic import AnthropicStream, fix_message, prepare_request, upstream_error
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
