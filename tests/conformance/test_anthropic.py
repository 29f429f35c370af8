"""``/v1/messages`` and ``/v1/messages/count_tokens`` through the official ``anthropic`` SDK."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.closing import closed_after_test
from tests.conformance.agent_model import AGENT_NAME
from tests.conformance.fuzz import anthropic_bodies, bodies
from tests.integration.conftest import MODEL_NAME

pytestmark = [pytest.mark.integration, pytest.mark.model]

QUESTION = "What is the capital of France? Answer in one word."


def _client(base_url: str) -> anthropic.Anthropic:
    return closed_after_test(anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0))


def test_message_not_streamed(base_url: str) -> None:
    msg = _client(base_url).messages.create(
        model=MODEL_NAME, max_tokens=32, extra_body={"temperature": 0},
        system="You are a geography teacher.", messages=[{"role": "user", "content": QUESTION}],
    )
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.id.startswith("msg_") and msg.model == MODEL_NAME
    assert msg.stop_reason == "end_turn"
    assert [b.type for b in msg.content] == ["text"]
    assert "Paris" in msg.content[0].text  # type: ignore[union-attr]
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 10
    assert 0 < msg.usage.output_tokens <= 32


def test_max_tokens_stop_reason_and_count(base_url: str) -> None:
    msg = _client(base_url).messages.create(
        model=MODEL_NAME, max_tokens=3, messages=[{"role": "user", "content": "Count to fifty in words."}],
    )
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 3


def test_stream_event_order(base_url: str) -> None:
    client = _client(base_url)
    with client.messages.stream(model=MODEL_NAME, max_tokens=16, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": QUESTION}]) as stream:
        events = [e.type for e in stream if e.type in {
            "message_start", "content_block_start", "content_block_delta", "content_block_stop",
            "message_delta", "message_stop"}]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[1] == "content_block_start"
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(events[2:-3]) == {"content_block_delta"}
    assert final.id.startswith("msg_") and final.model == MODEL_NAME
    assert "Paris" in final.content[0].text  # type: ignore[union-attr]
    assert final.usage.output_tokens == len(events[2:-3]) or final.usage.output_tokens > 0


def test_stream_raw_has_ping_after_message_start(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=120) as c, c.stream("POST", "/v1/messages", json={
        "model": MODEL_NAME, "max_tokens": 4, "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        names = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"


def test_system_messages_anywhere(base_url: str) -> None:
    msg = _client(base_url).messages.create(
        model=MODEL_NAME, max_tokens=8, system="You are a geography teacher.",
        messages=[{"role": "user", "content": QUESTION},
                  {"role": "system", "content": "Answer briefly."}],  # type: ignore[list-item]
    )
    assert msg.type == "message" and msg.stop_reason in {"end_turn", "max_tokens"}


WEATHER: Any = {"name": "get_weather", "description": "The current weather in a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"]}}


def test_tools_need_the_tools_capability(base_url: str) -> None:
    """SmolLM2's own template cannot render tools: Ollama's capability check, in Anthropic's shape."""
    with pytest.raises(anthropic.BadRequestError) as refused:
        _client(base_url).messages.create(model=MODEL_NAME, max_tokens=8, tools=[WEATHER],
                                          messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert refused.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": f"{MODEL_NAME} does not support tools"}}


def _forced_call(client: anthropic.Anthropic, stream: bool) -> tuple[Any, list[str]]:
    """Ask for the weather with get_weather forced: the message, and the stream's event types."""
    kwargs: Any = {"model": AGENT_NAME, "max_tokens": 64, "tools": [WEATHER],
                   "extra_body": {"temperature": 0}, "tool_choice": {"type": "tool", "name": "get_weather"},
                   "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
    if not stream:
        return client.messages.create(**kwargs), []
    with client.messages.stream(**kwargs) as events:
        names = [e.type for e in events if e.type in {
            "message_start", "content_block_start", "content_block_delta", "content_block_stop",
            "message_delta", "message_stop"}]
        return events.get_final_message(), names


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip(base_url: str, stream: bool) -> None:
    """A forced tool call (SmolLM2 writes the input under the tool's JSON-schema grammar), then its result
    sent back as a tool_result, answered with text."""
    client = _client(base_url)
    msg, events = _forced_call(client, stream)
    assert msg.id.startswith("msg_") and msg.model == AGENT_NAME and msg.stop_reason == "tool_use"
    assert [b.type for b in msg.content] == ["tool_use"]
    call = msg.content[0]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    assert isinstance(call.input, dict) and isinstance(call.input["city"], str)
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 20
    assert msg.usage.output_tokens > 0
    if stream:
        assert events[:2] == ["message_start", "content_block_start"]
        assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert set(events[2:-3]) == {"content_block_delta"}
    answer = client.messages.create(
        model=AGENT_NAME, max_tokens=16, extra_body={"temperature": 0}, tools=[WEATHER],
        thinking={"type": "disabled"},
        messages=[{"role": "user", "content": "What is the weather in Paris?"},
                  {"role": "assistant", "content": msg.content},  # type: ignore[typeddict-item]
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                "content": "Sunny, 21 C"}]}],
    )
    assert answer.id.startswith("msg_") and answer.stop_reason in {"end_turn", "max_tokens", "tool_use"}
    assert "text" in [b.type for b in answer.content]
    assert answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0) > 20


def test_tool_result_must_answer_a_tool_use(base_url: str) -> None:
    with pytest.raises(anthropic.BadRequestError, match="Each `tool_result` block must have a corresponding"):
        _client(base_url).messages.create(
            model=AGENT_NAME, max_tokens=8, tools=[WEATHER],
            messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x",
                                                    "content": "Sunny"}]}])


THINK: Any = {"type": "enabled", "budget_tokens": 1024}


def test_thinking_blocks_streamed_as_anthropic_sends_them(base_url: str) -> None:
    """``thinking: enabled`` turns the template's thinking on: a thinking block (thinking_delta events,
    then one signature_delta) before the block stops. SmolLM2 never closes its thinking, so a stop
    sequence ends the answer early."""
    client = _client(base_url)
    with client.messages.stream(model=AGENT_NAME, max_tokens=1100, thinking=THINK, stop_sequences=["."],
                                messages=[{"role": "user", "content": "Hi"}]) as stream:
        events = [e for e in stream if e.type not in {"text", "thinking", "signature", "input_json"}]
        final = stream.get_final_message()
    names = [e.type for e in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]  # type: ignore[union-attr]
    assert deltas[0] == "thinking_delta" and deltas.count("signature_delta") == 1
    starts = [e for e in events if e.type == "content_block_start"]
    assert starts[0].content_block.type == "thinking"  # type: ignore[union-attr]
    assert final.content[0].type == "thinking" and final.content[0].thinking  # type: ignore[union-attr]
    # sampled (thinking allows no temperature but 1): usually the stop sequence, possibly the end of turn
    assert final.stop_reason in {"stop_sequence", "end_turn", "max_tokens"}


def test_stop_sequence_is_the_stop_reason(base_url: str) -> None:
    """llama-server says ``end_turn`` and names the sequence; Anthropic says ``stop_sequence``."""
    client = _client(base_url)
    kwargs: Any = {"model": MODEL_NAME, "max_tokens": 64, "stop_sequences": ["."],
                   "extra_body": {"temperature": 0},
                   "messages": [{"role": "user", "content": "Tell me about Paris."}]}
    msg = client.messages.create(**kwargs)
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", ".")
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", ".")


def test_thinking_disabled_and_relaxed(base_url: str) -> None:
    client = _client(base_url)
    plain = client.messages.create(model=AGENT_NAME, max_tokens=8, thinking={"type": "disabled"},
                                   messages=[{"role": "user", "content": "Hi"}])
    assert [b.type for b in plain.content] == ["text"]
    thought = client.messages.create(model=AGENT_NAME, max_tokens=1100, thinking=THINK, stop_sequences=["."],
                                     messages=[{"role": "user", "content": "Hi"}])
    assert thought.content[0].type == "thinking"
    # SmolLM2 itself cannot think: the request is relaxed to no thinking, not refused
    relaxed = client.messages.create(model=MODEL_NAME, max_tokens=1100, thinking=THINK, stop_sequences=["."],
                                     messages=[{"role": "user", "content": QUESTION}])
    assert relaxed.content and all(b.type == "text" for b in relaxed.content)


def test_count_tokens(base_url: str) -> None:
    client = _client(base_url)
    # SmolLM2's template adds its own default system prompt when none is given: compare like with like.
    short = client.messages.count_tokens(model=MODEL_NAME, system="You are terse.",
                                         messages=[{"role": "user", "content": "Hi"}])
    longer = client.messages.count_tokens(model=MODEL_NAME, system="You are terse.",
                                          messages=[{"role": "user", "content": "Hi there, how are you?"}])
    assert 0 < short.input_tokens < longer.input_tokens
    # the same count generation reports (cache reads included)
    msg = client.messages.create(model=MODEL_NAME, max_tokens=1, system="You are terse.",
                                 messages=[{"role": "user", "content": "Hi"}])
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == short.input_tokens


def test_errors_in_anthropic_shape(base_url: str) -> None:
    client = _client(base_url)
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope:1b", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert missing.value.body == {"type": "error", "error": {
        "type": "not_found_error", "message": "model 'nope:1b' not found"}}
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL_NAME, max_tokens=-1, messages=[{"role": "user", "content": "x"}])
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    # SmolLM2 has no projector: Ollama's capability check
    with pytest.raises(anthropic.BadRequestError, match=f"{MODEL_NAME} does not support vision"):
        image: Any = {"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
        client.messages.create(model=MODEL_NAME, max_tokens=4,
                               messages=[{"role": "user", "content": [image]}])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}]}, "max_tokens: Field required"),
        ({"model": MODEL_NAME, "max_tokens": 4,
          "messages": [{"role": "user", "content": [{"type": "text"}]}]},
         "messages.0.content.0.text: Field required"),
        ({"model": MODEL_NAME, "max_tokens": 4,
          "messages": [{"role": "user", "content": [{"type": "bogus"}]}]},
         "messages.0.content.0.type: Input tag 'bogus'"),
        ({"model": MODEL_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
          "system": [{"type": "text"}]}, "system.0.text: Field required"),
        ({"model": MODEL_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
          "stop_sequences": "x"}, "stop_sequences: Input should be a valid list"),
        ({"model": MODEL_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
          "tools": [{"name": "f"}]}, "tools.0.input_schema: Field required"),
        ({"model": MODEL_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
          "temperature": "hot"}, "temperature: Input should be a valid number"),
    ],
)
def test_malformed_bodies_are_anthropic_400s(base_url: str, body: dict[str, Any], message: str) -> None:
    r = httpx.post(base_url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"].startswith(message)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies("model", "messages", "max_tokens", "system", "stream") | anthropic_bodies(MODEL_NAME)
       | anthropic_bodies(AGENT_NAME), path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]))
def test_fuzzed_bodies_never_500(base_url: str, body: bytes, path: str) -> None:
    r = httpx.post(base_url + path, content=body, timeout=60)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        err = r.json()
        assert err["type"] == "error" and isinstance(err["error"]["message"], str)
        if r.status_code == 400:
            assert err["error"]["type"] == "invalid_request_error"
