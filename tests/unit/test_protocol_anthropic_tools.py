"""Table tests of the forced-tool translation (protocol/anthropic_tools.py): Anthropic request ->
``/v1/chat/completions`` with a JSON-schema grammar, and the chat answer (whole, or a recorded llama-server
stream cut at every size) -> Anthropic's ``tool_use`` message and events."""

from __future__ import annotations

import importlib
from typing import Any

import anthropic
import orjson
import pytest

from llmman.protocol.anthropic.tools import ForcedToolStream, chat_messages, forced_message, forced_request
from llmman.protocol.framing import SSEDecoder

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "Weather for a city", "input_schema": SCHEMA}
TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}}


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    body = {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}], "created": 1796011125,
            "id": "chatcmpl-mjZsPELZ", "model": "smolt", "object": "chat.completion.chunk", **extra}
    return "data: " + orjson.dumps(body).decode() + "\n\n"


# Recorded from llama-server b11434 /v1/chat/completions (SmolLM2-135M with a tools template), the body
# forced_request builds for get_weather; "Paris" made "Pärïs ✓" to split multi-byte characters.
PIECES = ["{", "\n ", ' "', "city", '":', ' "', "Pärïs ✓", '"', "\n", "}"]
USAGE = {"completion_tokens": 16, "prompt_tokens": 190, "total_tokens": 206,
         "prompt_tokens_details": {"cached_tokens": 189}}
RECORDED = (
    _chunk({"role": "assistant", "content": None})
    + "".join(_chunk({"content": p}) for p in PIECES)
    + _chunk({}, "stop")
    + "data: " + orjson.dumps({"choices": [], "created": 1796011125, "id": "chatcmpl-mjZsPELZ",
                               "model": "smolt", "object": "chat.completion.chunk", "usage": USAGE}).decode()
    + "\n\n"
    + "data: [DONE]\n\n"
).encode()


def _run(chunks: list[bytes], tools: list[dict[str, Any]] | None = None) -> list[tuple[str, dict[str, Any]]]:
    decoder, stream, out = SSEDecoder(), ForcedToolStream("smollm2-agent", tools or [WEATHER]), b""
    for chunk in chunks:
        for event in decoder.feed(chunk):
            out += stream.feed(event)
    for event in decoder.close():
        out += stream.feed(event)
    out += stream.close()
    return [(e.event or "", orjson.loads(e.data)) for e in SSEDecoder().feed(out)]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 50, len(RECORDED)])
def test_recorded_stream_becomes_tool_use_events(size: int) -> None:
    events = _run([RECORDED[i:i + size] for i in range(0, len(RECORDED), size)])
    assert [n for n, _ in events] == ["message_start", "ping", "content_block_start",
                                      *["content_block_delta"] * len(PIECES), "content_block_stop",
                                      "message_delta", "message_stop"]
    assert all(n == d["type"] for n, d in events)
    start = events[0][1]["message"]
    assert start["id"] == "msg_mjZsPELZ" and start["model"] == "smollm2-agent" and start["content"] == []
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {
        "type": "tool_use", "id": "toolu_mjZsPELZ", "name": "get_weather", "input": {}}}
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert orjson.loads(partial) == {"city": "Pärïs ✓"}
    assert events[-2][1] == {
        "type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"cache_read_input_tokens": 189, "input_tokens": 1, "output_tokens": 16},
    }


def _translated(chunks: list[bytes], tools: list[dict[str, Any]]) -> bytes:
    decoder, stream, out = SSEDecoder(), ForcedToolStream("smollm2-agent", tools), b""
    for chunk in chunks:
        for event in decoder.feed(chunk):
            out += stream.feed(event)
    return out + stream.close()


def test_the_sdk_accumulates_the_translated_stream() -> None:
    """The official SDK (its public streaming helper, over a mock transport) reads the events into one
    tool_use message."""
    sse = _translated([RECORDED], [WEATHER])
    # the HTTP package this SDK is built on (httpx, or its fork httpx2 in newer releases)
    http = importlib.import_module(anthropic.DefaultHttpxClient.__mro__[1].__module__.split(".")[0])
    transport = http.MockTransport(lambda request: http.Response(
        200, content=sse, headers={"content-type": "text/event-stream"}))
    client = anthropic.Anthropic(base_url="http://llmman.test", api_key="x", max_retries=0,
                                 http_client=anthropic.DefaultHttpxClient(transport=transport))
    with client.messages.stream(model="smollm2-agent", max_tokens=64, tools=[WEATHER],  # type: ignore[list-item]
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=[{"role": "user", "content": "Weather?"}]) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "tool_use" and message.id == "msg_mjZsPELZ"
    block = message.content[0]
    assert block.type == "tool_use" and block.input == {"city": "Pärïs ✓"} and block.id == "toolu_mjZsPELZ"
    assert message.usage.output_tokens == 16 and message.usage.input_tokens == 1


def test_stream_without_done_still_closes_when_the_model_finished() -> None:
    events = _run([RECORDED[: RECORDED.index(b"data: [DONE]")]])
    assert [n for n, _ in events][-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_stream_cut_before_the_finish_ends_with_an_error_event() -> None:
    cut = RECORDED[: RECORDED.index(b'"content":"city"')]
    events = _run([cut])
    assert events[-1] == ("error", {"type": "error", "error": {
        "type": "api_error", "message": "the model's answer ended before it finished"}})


def test_upstream_error_event_and_empty_or_malformed_events() -> None:
    error = (b'data: {"error":{"code":500,"message":"Context size has been exceeded.",'
             b'"type":"server_error"}}\n\n')
    events = _run([b"data: not json\n\n", b"data: []\n\n", _chunk({"role": "assistant"}).encode(),
                   _chunk({"content": ""}).encode(), error])
    assert [n for n, _ in events] == ["message_start", "ping", "content_block_start", "error"]
    assert events[-1][1]["error"] == {"type": "api_error", "message": "Context size has been exceeded."}


def test_any_over_several_tools_sends_the_named_block_whole() -> None:
    text = '{"name": "get_time", "input": {"tz": "Europe/Paris"}}'
    stream = (_chunk({"role": "assistant"}) + _chunk({"content": text[:10]}) + _chunk({"content": text[10:]})
              + _chunk({}, "stop") + "data: [DONE]\n\n").encode()
    events = _run([stream], tools=[WEATHER, TIME])
    assert [n for n, _ in events] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop"]
    assert events[2][1]["content_block"]["name"] == "get_time"
    assert orjson.loads(events[3][1]["delta"]["partial_json"]) == {"tz": "Europe/Paris"}


def test_chat_messages_convert_every_block() -> None:
    body = {"system": "Be brief.", "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "call it", "signature": ""},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
            {"type": "text", "text": "And this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
        {"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "doc"}}]},
    ]}
    assert chat_messages(body) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "call it", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom"},
        {"role": "user", "content": [
            {"type": "text", "text": "And this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
        {"role": "user", "content": "doc"},
    ]


def test_forced_request_shape() -> None:
    body = {"model": "m", "max_tokens": 64, "stream": True, "temperature": 0, "top_k": 5,
            "stop_sequences": ["\n\n"], "messages": [{"role": "user", "content": "Weather?"}]}
    out = forced_request(body, [WEATHER])
    assert out["response_format"] == {"type": "json_schema", "json_schema": {"name": "get_weather",
                                                                            "schema": SCHEMA}}
    assert "tools" not in out and "tool_choice" not in out and out["reasoning_effort"] == "none"
    assert out["messages"] == [
        {"role": "system", "content": "Call the tool get_weather (Weather for a city). Reply with its input "
                                      "as a JSON object."},
        {"role": "user", "content": "Weather?"}]
    assert out["chat_template_kwargs"] == {"enable_thinking": False}
    assert (out["max_tokens"], out["temperature"], out["top_k"], out["stop"]) == (64, 0, 5, ["\n\n"])
    assert out["stream"] is True and out["stream_options"] == {"include_usage": True}
    several = forced_request({**body, "stream": False, "system": "Be brief."}, [WEATHER, TIME])
    assert several["messages"][0] == {  # type: ignore[index]
        "role": "system",
        "content": "Be brief.\n\nCall one of these tools. Reply with a JSON object naming the tool and "
                   "giving its input.\n- get_weather: Weather for a city\n- get_time"}
    schema = several["response_format"]["json_schema"]["schema"]  # type: ignore[index]
    assert [alt["properties"]["name"] for alt in schema["anyOf"]] == [{"const": "get_weather"},
                                                                       {"const": "get_time"}]
    assert "stream" not in several


@pytest.mark.parametrize(
    ("content", "finish", "tools", "name", "tool_input", "stop"),
    [
        ('{"city": "Paris"}', "stop", [WEATHER], "get_weather", {"city": "Paris"}, "tool_use"),
        ('{"city": "Par', "length", [WEATHER], "get_weather", {}, "max_tokens"),
        ("not json", "stop", [WEATHER], "get_weather", {}, "tool_use"),
        ('{"name": "get_time", "input": {"tz": "UTC"}}', "stop", [WEATHER, TIME], "get_time", {"tz": "UTC"},
         "tool_use"),
        ('{"name": "nope", "input": {}}', "stop", [WEATHER, TIME], "get_weather", {}, "tool_use"),
    ],
)
def test_forced_message(content: str, finish: str, tools: list[dict[str, Any]], name: str,
                        tool_input: dict[str, Any], stop: str) -> None:  # fmt: skip
    answer = {"id": "chatcmpl-abc", "choices": [{"index": 0, "finish_reason": finish,
                                                 "message": {"role": "assistant", "content": content}}],
              "usage": USAGE}
    assert forced_message(answer, tools, "m") == {
        "id": "msg_abc", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "tool_use", "id": "toolu_abc", "name": name, "input": tool_input}],
        "stop_reason": stop, "stop_sequence": None,
        "usage": {"cache_read_input_tokens": 189, "input_tokens": 1, "output_tokens": 16},
    }
