"""OpenAI dialect through the official ``openai`` SDK: chat, Responses (Codex-shaped bodies included),
model listing and errors."""

from __future__ import annotations

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conformance.fuzz import bodies
from tests.integration.conftest import MODEL_NAME, MODEL_REF

pytestmark = [pytest.mark.integration, pytest.mark.model]

QUESTION = "What is the capital of France? Answer in one word."


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def test_chat_streamed_and_not(base_url: str) -> None:
    client = _client(base_url)
    reply = client.chat.completions.create(model=MODEL_NAME, temperature=0,
                                           messages=[{"role": "user", "content": QUESTION}])
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(model=MODEL_NAME, temperature=0, stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": QUESTION}]))
    assert "Paris" in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_models_carry_context_length(base_url: str) -> None:
    models = _client(base_url).models.list().data
    entry = next(m for m in models if m.id == MODEL_REF)
    extra = entry.model_extra or {}
    assert extra["context_length"] == extra["max_model_len"] and extra["context_length"] > 0


def test_responses_codex_shaped(base_url: str) -> None:
    client = _client(base_url)
    reply = client.responses.create(
        model=MODEL_NAME, max_output_tokens=16, temperature=0,
        tools=[{"type": "web_search"}],  # type: ignore[list-item]
        input=[{"role": "developer", "content": "You answer geography questions."},
               {"role": "user", "content": QUESTION}],
    )
    assert reply.object == "response" and reply.status in {"completed", "incomplete"}
    assert reply.id.startswith("resp_") and "Paris" in reply.output_text
    assert reply.usage is not None and reply.usage.output_tokens > 0

    events = [e.type for e in client.responses.create(model=MODEL_NAME, max_output_tokens=4, input="Hi",
                                                      stream=True)]
    assert events[:2] == ["response.created", "response.in_progress"]
    assert events[-1] == "response.completed" and "response.output_text.delta" in events


def test_responses_input_tokens(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=120) as c:
        short = c.post("/v1/responses/input_tokens", json={"model": MODEL_NAME, "input": "Hi"}).json()
        longer = c.post("/v1/responses/input_tokens",
                        json={"model": MODEL_NAME, "input": "Hi there, how are you today?"}).json()
    assert short["object"] == "response.input_tokens" and 0 < short["input_tokens"] < longer["input_tokens"]


def test_errors_in_openai_shape(base_url: str) -> None:
    client = _client(base_url)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope:1b", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope:1b", input="x")
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL_NAME, input=5)  # type: ignore[arg-type]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies("model", "input", "tools", "instructions", "stream"),
       path=st.sampled_from(["/v1/responses", "/v1/responses/input_tokens"]))
def test_fuzzed_bodies_never_500(base_url: str, body: bytes, path: str) -> None:
    r = httpx.post(base_url + path, content=body, timeout=60)
    assert r.status_code < 500 or r.status_code == 501, r.text
    if r.status_code >= 400:
        assert isinstance(r.json()["error"]["message"], str)
