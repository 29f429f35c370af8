"""``/v1/messages`` and ``/v1/messages/count_tokens`` through the official ``anthropic`` SDK."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conformance.fuzz import bodies
from tests.integration.conftest import MODEL_NAME

pytestmark = [pytest.mark.integration, pytest.mark.model]

QUESTION = "What is the capital of France? Answer in one word."


def _client(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0)


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


def test_system_messages_anywhere_and_tools_round_trip(base_url: str) -> None:
    msg = _client(base_url).messages.create(
        model=MODEL_NAME, max_tokens=8,
        tools=[{"name": "get_weather", "description": "Weather for a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 C"}]},
            {"role": "system", "content": "Answer briefly."},
        ],
    )
    assert msg.type == "message" and msg.stop_reason in {"end_turn", "max_tokens", "tool_use"}


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
    with pytest.raises(anthropic.BadRequestError, match="image"):  # SmolLM2 has no projector
        image: Any = {"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
        client.messages.create(model=MODEL_NAME, max_tokens=4,
                               messages=[{"role": "user", "content": [image]}])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies("model", "messages", "max_tokens", "system", "stream"),
       path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]))
def test_fuzzed_bodies_never_500(base_url: str, body: bytes, path: str) -> None:
    r = httpx.post(base_url + path, content=body, timeout=60)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        err = r.json()
        assert err["type"] == "error" and isinstance(err["error"]["message"], str)
