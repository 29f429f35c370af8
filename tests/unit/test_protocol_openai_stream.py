"""llmman.protocol.openai.stream: the byte-level fixes of an OpenAI-shaped answer (issue 14 items 0, 1, 3).

Each stream is fed whole and cut at every byte, so a fix never depends on how the network cut it.
"""

from __future__ import annotations

import orjson
import pytest

from llmman.protocol.framing import SSEDecoder
from llmman.protocol.openai.stream import Kind, OpenAIStream, fix_arguments, stringify_arguments

IDS = {"id": "chatcmpl-1", "model": "m", "system_fingerprint": "b1", "object": "chat.completion.chunk"}


def chunk(created: int, delta: dict[str, object], finish: str | None = None, **extra: object) -> bytes:
    obj = {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}], "created": created, **IDS,
           **extra}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def run(stream: bytes, kind: Kind, *, cut: int | None = None, **kw: object) -> bytes:
    fix = OpenAIStream(kind, new_id=lambda: "resp_new", **kw)  # type: ignore[arg-type]
    if cut is None:
        return fix.feed(stream) + fix.flush()
    return fix.feed(stream[:cut]) + fix.feed(stream[cut:]) + fix.flush()


def events(data: bytes) -> list[dict[str, object]]:
    dec = SSEDecoder()
    out = [e for e in dec.feed(data) + dec.close() if e.data != "[DONE]"]
    return [orjson.loads(e.data) for e in out]


def every_cut(stream: bytes, kind: Kind, **kw: object) -> bytes:
    whole = run(stream, kind, **kw)
    for cut in range(1, len(stream)):
        assert run(stream, kind, cut=cut, **kw) == whole, cut
    return whole


ROLE = chunk(100, {"role": "assistant", "content": None})
TEXT = chunk(100, {"content": "Hi"}) + chunk(101, {"content": "!"}) + chunk(102, {}, "stop")
DONE = b"data: [DONE]\n\n"


def test_a_chat_stream_that_starts_with_its_role_chunk_is_unchanged() -> None:
    same = ROLE + chunk(100, {"content": "Hi"}) + chunk(100, {}, "stop") + DONE
    assert every_cut(same, Kind.CHAT) == same


def test_a_chat_stream_without_its_role_chunk_gets_one_first_made_from_the_first_chunk() -> None:
    out = events(every_cut(TEXT + DONE, Kind.CHAT))
    assert out[0]["choices"] == [{"index": 0, "finish_reason": None,
                                  "delta": {"role": "assistant", "content": None}}]
    assert {k: out[0][k] for k in IDS} == IDS
    assert [e["choices"][0]["delta"] for e in out[1:]] == [  # type: ignore[index]
        {"content": "Hi"}, {"content": "!"}, {}]


def test_created_is_the_first_chunks_in_every_chunk() -> None:
    out = events(every_cut(ROLE + TEXT + DONE, Kind.CHAT))
    assert [e["created"] for e in out] == [100, 100, 100, 100]
    completion = (b'data: {"choices":[{"text":"a","index":0}],"created":7,"object":"text_completion"}\n\n'
                  b'data: {"choices":[{"text":"b","index":0}],"created":8,"object":"text_completion"}\n\n')
    assert [e["created"] for e in events(every_cut(completion, Kind.COMPLETION))] == [7, 7]


def test_a_completion_streams_usage_in_a_chunk_of_its_own() -> None:
    usage = {"completion_tokens": 2, "prompt_tokens": 1, "total_tokens": 3}
    last = {"choices": [{"text": "", "index": 0, "finish_reason": "length"}], "created": 5, "id": "c",
            "model": "m", "object": "text_completion", "usage": usage, "timings": {"predicted_n": 2}}
    stream = (b'data: {"choices":[{"text":"a","index":0,"finish_reason":null}],"created":5,"id":"c",'
              b'"model":"m","object":"text_completion"}\n\n' + b"data: " + orjson.dumps(last) + b"\n\n"
              + DONE)
    out = events(every_cut(stream, Kind.COMPLETION, usage_chunk=True))
    assert [e["choices"] for e in out][1:] == [[{"text": "", "index": 0, "finish_reason": "length"}], []]
    assert "usage" not in out[1] and out[2]["usage"] == usage and out[2]["id"] == "c"
    assert out[2]["timings"] == {"predicted_n": 2}
    # without include_usage nothing moves
    assert events(run(stream, Kind.COMPLETION))[1]["usage"] == usage


def test_a_responses_stream_begins_with_response_created_whatever_the_child_sent_first() -> None:
    head = {"id": "resp_1", "object": "response", "status": "in_progress"}
    progress = b"event: response.in_progress\ndata: " + orjson.dumps(
        {"type": "response.in_progress", "response": head}) + b"\n\n"
    delta = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"x"}\n\n'
    created = b"event: response.created\ndata: " + orjson.dumps(
        {"type": "response.created", "response": head}) + b"\n\n"
    assert every_cut(created + progress + delta, Kind.RESPONSES) == created + progress + delta
    out = every_cut(progress + delta, Kind.RESPONSES)
    assert out == created + progress + delta
    made = events(every_cut(delta, Kind.RESPONSES))[0]
    assert made == {"type": "response.created",
                    "response": {"id": "resp_new", "object": "response", "status": "in_progress"}}
    assert every_cut(DONE, Kind.RESPONSES) == DONE  # nothing to start


def test_an_error_first_is_not_given_a_start() -> None:
    error = b'data: {"error":{"code":500,"message":"boom"}}\n\n'
    assert every_cut(error, Kind.CHAT) == error


def test_object_arguments_become_strings_streamed_and_whole() -> None:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    stream = ROLE + chunk(100, {"tool_calls": [call]}) + chunk(100, {}, "tool_calls") + DONE
    out = events(every_cut(stream, Kind.CHAT))
    fn = out[1]["choices"][0]["delta"]["tool_calls"][0]["function"]  # type: ignore[index]
    assert fn == {"name": "f", "arguments": '{"a":1}'}
    whole = orjson.dumps({"choices": [{"message": {"tool_calls": [call]}}]})
    fixed = orjson.loads(fix_arguments(whole))
    assert fixed["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"a":1}'
    text = orjson.dumps({"choices": [{"message": {"content": '"arguments":{ in text'}}]})
    assert fix_arguments(text) == text


def test_stringify_arguments_leaves_strings_and_reports_no_change() -> None:
    value = [{"function": {"arguments": "{}"}}]
    assert stringify_arguments(value) == (value, False)
    assert stringify_arguments([{"arguments": {"k": [1]}}]) == ([{"arguments": '{"k":[1]}'}], True)


@pytest.mark.parametrize("kind", list(Kind))
def test_a_tail_without_its_blank_line_comes_out_at_the_end(kind: Kind) -> None:
    fix = OpenAIStream(kind)
    assert fix.feed(b"data: [DONE]") == b""
    assert fix.flush() == b"data: [DONE]"
