"""llama-server SSE chunks -> Ollama NDJSON objects, checked against the official client's models."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import httpx
import ollama
import orjson
import pytest
from ollama._types import ChatResponse, GenerateResponse

from llmman.errors import RunnerError
from llmman.protocol.framing import SSEDecoder, ndjson, parse_data
from llmman.protocol.ollama.request import chat_request
from llmman.protocol.ollama.stream import OllamaStream, error_line, load_response

DATA = Path(__file__).parent / "data"
TS = "2026-01-01T00:00:00.000000000Z"
CALL_ID = re.compile(r"^call_[a-z0-9]{8}$")


def chunks(name: str) -> list[dict[str, object]]:
    """The parsed ``data:`` payloads of a recorded stream, ``[DONE]`` filtered out."""
    dec = SSEDecoder()
    events = dec.feed((DATA / name).read_bytes()) + dec.close()
    return [c for c in (parse_data(ev) for ev in events) if c is not None]


def run(
    name: str, kind: Literal["chat", "generate"] = "chat"
) -> tuple[OllamaStream, list[dict[str, object]]]:
    stream = OllamaStream(kind, "smollm2:latest", lambda: TS)
    out = [obj for c in chunks(name) for obj in stream.feed(c)]
    out.append(stream.final(total_duration_ns=2_000_000_000, load_duration_ns=500_000_000))
    return stream, out


def validate(obj: dict[str, object], kind: str) -> None:
    model = ChatResponse if kind == "chat" else GenerateResponse
    model.model_validate(orjson.loads(ndjson(obj)))


def test_basic_chat_stream() -> None:
    _, out = run("llama_chat_basic.txt")
    texts = [o["message"]["content"] for o in out[:-1]]  # type: ignore[index]
    assert texts == ["Caf", "é ", "日本 🦙", "!"]  # role-only, empty and finish chunks produce nothing
    assert all(
        o["done"] is False and o["model"] == "smollm2:latest" and o["created_at"] == TS for o in out[:-1]
    )
    assert [o["done"] for o in out].count(True) == 1
    assert out[-1] == {
        "model": "smollm2:latest",
        "created_at": TS,
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "stop",
        "total_duration": 2_000_000_000,
        "load_duration": 500_000_000,
        "prompt_eval_count": 20,
        "prompt_eval_duration": 12_500_000,
        "eval_count": 5,
        "eval_duration": 64_100_000,
    }
    for obj in out:
        validate(obj, "chat")


def test_thinking_and_length() -> None:
    stream, out = run("llama_chat_thinking.txt")
    assert [(o["message"].get("thinking"), o["message"]["content"]) for o in out[:-1]] == [  # type: ignore[attr-defined,index]
        ("The user wants ", ""),
        ("a number.", ""),
        (None, "42"),
    ]
    assert out[-1]["done_reason"] == "length"
    agg = stream.aggregate()
    assert agg["message"] == {"role": "assistant", "content": "42", "thinking": "The user wants a number."}
    assert agg["done"] is True and agg["done_reason"] == "length" and agg["eval_count"] == 4
    validate(agg, "chat")


def test_tool_calls_arrive_in_one_chunk_at_finish() -> None:
    stream, out = run("llama_chat_tool_calls.txt")
    assert len(out) == 2
    message = out[0]["message"]
    assert message["content"] == ""  # type: ignore[index]
    calls = message["tool_calls"]  # type: ignore[index]
    assert [c["function"] for c in calls] == [
        {"index": 0, "name": "get_weather", "arguments": {"city": "Zürich", "days": 2}},
        {"index": 1, "name": "get_time", "arguments": {}},
    ]
    assert all(CALL_ID.match(c["id"]) for c in calls) and calls[0]["id"] != calls[1]["id"]
    assert out[1]["done_reason"] == "stop"  # Ollama keeps "stop" after tool calls
    assert out[1]["prompt_eval_count"] == 120 and out[1]["eval_duration"] == 300_000_000
    assert stream.aggregate()["message"]["tool_calls"] == calls  # type: ignore[index]
    for obj in [*out, stream.aggregate()]:
        validate(obj, "chat")
        parsed = ChatResponse.model_validate(obj)
        assert parsed.message.role == "assistant"


def test_tool_call_ids_are_stable_and_injectable() -> None:
    a, b = run("llama_chat_tool_calls.txt")[1], run("llama_chat_tool_calls.txt")[1]
    assert a[0]["message"]["tool_calls"] == b[0]["message"]["tool_calls"]  # type: ignore[index]
    ids = iter(["call_aaaaaaaa", "call_bbbbbbbb"])
    stream = OllamaStream("chat", "m", lambda: TS, new_call_id=lambda: next(ids))
    out = [o for c in chunks("llama_chat_tool_calls.txt") for o in stream.feed(c)]
    assert [c["id"] for c in out[0]["message"]["tool_calls"]] == ["call_aaaaaaaa", "call_bbbbbbbb"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("fragments", "arguments"),
    [
        (['{"a":', " [1, 2]}"], {"a": [1, 2]}),
        ([""], {}),
        (['{"a": '], {"_raw": '{"a": '}),
        (["[1]"], {"_raw": "[1]"}),
    ],
)
def test_tool_call_arguments_parsing(fragments: list[str], arguments: dict[str, object]) -> None:
    stream = OllamaStream("chat", "m", lambda: TS)
    deltas = [{"index": 0, "id": "x", "function": {"name": "f", "arguments": ""}}]
    deltas += [{"index": 0, "function": {"arguments": f}} for f in fragments]
    for d in deltas:
        assert stream.feed({"choices": [{"index": 0, "delta": {"tool_calls": [d]}}]}) == []
    (obj,) = stream.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    assert obj["message"]["tool_calls"][0]["function"]["arguments"] == arguments  # type: ignore[index]


@pytest.mark.parametrize("whole", [True, False])
def test_object_arguments_are_kept_as_the_object(whole: bool) -> None:
    """Some llama-server builds stream ``arguments`` as a JSON object: it is Ollama's object, never ``{}``."""
    stream = OllamaStream("chat", "m", lambda: TS)
    head = {"index": 0, "id": "call_x", "function": {"name": "f", "arguments": {"a": 1, "b": "ü"}}}
    if not whole:  # the name first, the object in a chunk of its own
        head = {"index": 0, "id": "call_x", "function": {"name": "f", "arguments": ""}}
    deltas = [head] if whole else [head, {"index": 0, "function": {"arguments": {"a": 1, "b": "ü"}}}]
    for d in deltas:
        assert stream.feed({"choices": [{"index": 0, "delta": {"tool_calls": [d]}}]}) == []
    (obj,) = stream.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    (call,) = obj["message"]["tool_calls"]  # type: ignore[index]
    assert call["function"]["arguments"] == {"a": 1, "b": "ü"}
    assert call["id"].startswith("call_")


def test_unfinished_tool_calls_ride_on_the_final_object() -> None:
    stream = OllamaStream("chat", "m", lambda: TS)
    stream.feed(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": 0, "id": "q", "function": {"name": "f", "arguments": "{}"}}]
                    },
                }
            ]
        }
    )
    final = stream.final(total_duration_ns=1, load_duration_ns=0)
    assert final["message"]["tool_calls"][0]["function"]["name"] == "f"  # type: ignore[index]
    validate(final, "chat")


def test_error_chunk_raises_runner_error_after_content() -> None:
    stream = OllamaStream("chat", "m", lambda: TS)
    payloads = chunks("llama_chat_error.txt")
    assert stream.feed(payloads[0]) == []
    assert stream.feed(payloads[1])[0]["message"]["content"] == "Hel"  # type: ignore[index]
    with pytest.raises(RunnerError, match=r"Context size has been exceeded\.") as err:
        stream.feed(payloads[2])
    assert err.value.status == 500
    assert error_line(str(err.value)) == {"error": "Context size has been exceeded."}


def test_stream_without_done_or_usage_uses_timings() -> None:
    _, out = run("llama_chat_no_done.txt")
    assert [o["message"]["content"] for o in out] == ["ok", ""]  # type: ignore[index]
    assert out[-1]["prompt_eval_count"] == 5  # prompt_n + cache_n
    assert out[-1]["prompt_eval_duration"] == 1_500_000
    assert out[-1]["eval_count"] == 1 and out[-1]["eval_duration"] == 2_250_000


@pytest.mark.parametrize(
    ("extra", "metrics"),
    [
        ({}, {"total_duration": 9}),
        (
            {"usage": {"prompt_tokens": 7, "completion_tokens": 3}},
            {"total_duration": 9, "prompt_eval_count": 7, "eval_count": 3},
        ),
        (
            {
                "timings": {
                    "prompt_n": 0,
                    "cache_n": 6,
                    "prompt_ms": 0.0,
                    "predicted_n": 2,
                    "predicted_ms": 0.0004,
                }
            },
            {"total_duration": 9, "prompt_eval_count": 6, "eval_count": 2, "eval_duration": 400},
        ),
    ],
)
def test_metrics_fallbacks_and_omitted_zeros(extra: dict[str, object], metrics: dict[str, int]) -> None:
    stream = OllamaStream("generate", "m", lambda: TS)
    stream.feed({"choices": [], **extra})
    final = stream.final(total_duration_ns=9, load_duration_ns=0)
    assert {k: v for k, v in final.items() if k.endswith(("_duration", "_count"))} == metrics
    assert all(type(v) is int for v in metrics.values())
    validate(final, "generate")


def test_raw_generate_from_completions_stream() -> None:
    stream, out = run("llama_completions_raw.txt", "generate")
    assert [o["response"] for o in out] == ["Once", " upon", " a time", ""]
    assert out[-1]["done_reason"] == "length" and "message" not in out[-1]
    agg = stream.aggregate()
    assert agg["response"] == "Once upon a time" and agg["eval_count"] == 3 and agg["done"] is True
    for obj in [*out, agg]:
        validate(obj, "generate")


def test_generate_over_chat_stream_with_thinking() -> None:
    stream, out = run("llama_chat_thinking.txt", "generate")
    assert [(o.get("thinking"), o["response"]) for o in out[:-1]] == [
        ("The user wants ", ""),
        ("a number.", ""),
        (None, "42"),
    ]
    agg = stream.aggregate()
    assert agg["response"] == "42" and agg["thinking"] == "The user wants a number."


def test_single_is_final_plus_aggregate() -> None:
    stream = OllamaStream("chat", "m", lambda: TS)
    for c in chunks("llama_chat_basic.txt"):
        stream.feed(c)
    obj = stream.single(total_duration_ns=10, load_duration_ns=1)
    assert obj["message"] == {"role": "assistant", "content": "Café 日本 🦙!"}
    assert obj["done"] is True and obj["total_duration"] == 10 and obj["load_duration"] == 1


def test_logprobs_are_translated() -> None:
    stream = OllamaStream("chat", "m", lambda: TS)
    lp = {
        "content": [
            {
                "id": 5,
                "token": "Hi",
                "bytes": [72, 105],
                "logprob": -0.5,
                "top_logprobs": [{"id": 5, "token": "Hi", "logprob": -0.5}, {"token": "Yo", "logprob": -2}],
            }
        ]
    }
    (obj,) = stream.feed({"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": lp}]})
    assert obj["logprobs"] == [
        {
            "token": "Hi",
            "logprob": -0.5,
            "top_logprobs": [{"token": "Hi", "logprob": -0.5}, {"token": "Yo", "logprob": -2.0}],
        }
    ]
    validate(obj, "chat")
    stream.final(total_duration_ns=1, load_duration_ns=1)
    assert stream.aggregate()["logprobs"] == obj["logprobs"]


def test_exactly_one_done_line_is_enforced() -> None:
    stream = OllamaStream("chat", "m", lambda: TS)
    stream.final(total_duration_ns=1, load_duration_ns=1)
    with pytest.raises(RuntimeError):
        stream.final(total_duration_ns=1, load_duration_ns=1)
    with pytest.raises(RuntimeError):
        stream.feed({"choices": []})
    with pytest.raises(RuntimeError):
        OllamaStream("chat", "m", lambda: TS).aggregate()


@pytest.mark.parametrize("kind", ["chat", "generate"])
@pytest.mark.parametrize("reason", ["load", "unload"])
def test_load_response(kind: Literal["chat", "generate"], reason: Literal["load", "unload"]) -> None:
    obj = load_response(kind, "M:latest", TS, reason)
    body = {"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""}
    assert obj == {"model": "M:latest", "created_at": TS, **body, "done": True, "done_reason": reason}
    validate(obj, kind)


def test_official_client_end_to_end_through_mock_transport() -> None:
    """ollama.Client -> chat_request -> recorded llama-server stream -> OllamaStream -> NDJSON -> client."""
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        req = chat_request(orjson.loads(request.content))
        seen.append(req.body)
        stream = OllamaStream("chat", req.model, lambda: TS)
        lines = [ndjson(o) for c in chunks("llama_chat_tool_calls.txt") for o in stream.feed(c)]
        if not req.stream:
            return httpx.Response(
                200, content=orjson.dumps(stream.single(total_duration_ns=5, load_duration_ns=1))
            )
        lines.append(ndjson(stream.final(total_duration_ns=5, load_duration_ns=1)))
        return httpx.Response(200, content=b"".join(lines), headers={"content-type": "application/x-ndjson"})

    client = ollama.Client(host="http://127.0.0.1:1", transport=httpx.MockTransport(handler))
    parts = list(
        client.chat(
            model="smollm2",
            messages=[{"role": "user", "content": "weather?"}],
            stream=True,
            options={"temperature": 0},
            think=False,
        )
    )
    assert parts[-1].done and parts[-1].done_reason == "stop" and parts[-1].eval_count == 30
    calls = parts[0].message.tool_calls
    assert calls is not None and calls[0].function.arguments == {"city": "Zürich", "days": 2}
    whole = client.chat(model="smollm2", messages=[{"role": "user", "content": "weather?"}])
    assert whole.done and whole.message.tool_calls is not None and len(whole.message.tool_calls) == 2
    assert seen[0]["temperature"] == 0 and seen[0]["reasoning_effort"] == "none"
    assert all(b["stream"] is True for b in seen)
