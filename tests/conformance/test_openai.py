"""OpenAI dialect through the official ``openai`` SDK: chat, Responses (Codex-shaped bodies included),
model listing and errors."""

from __future__ import annotations

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.closing import closed_after_test
from tests.conformance.agent_model import AGENT_NAME
from tests.conformance.fuzz import bodies, openai_chat_bodies
from tests.integration.conftest import MODEL_NAME, MODEL_REF

pytestmark = [pytest.mark.integration, pytest.mark.model]

QUESTION = "What is the capital of France? Answer in one word."


def _client(base_url: str) -> openai.OpenAI:
    return closed_after_test(openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0))


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


def test_answers_echo_the_requested_model(base_url: str) -> None:
    """llama-server names itself by its alias (the canonical reference); clients get the name they sent,
    as from Ollama, streamed and not, on every passed-through route; the full reference stays as is."""
    client = _client(base_url)
    msgs: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]
    for name in (MODEL_NAME, MODEL_REF):
        assert client.chat.completions.create(model=name, max_tokens=2, messages=msgs).model == name
        chunks = list(client.chat.completions.create(model=name, max_tokens=2, messages=msgs, stream=True))
        assert chunks and {c.model for c in chunks} == {name}
    assert client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2).model == MODEL_NAME
    pieces = list(client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2, stream=True))
    assert pieces and {p.model for p in pieces} == {MODEL_NAME}
    assert client.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=2).model == MODEL_NAME
    events = list(client.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=2, stream=True))
    # llama-server's response.created / in_progress events carry no model; response.completed does
    named = {r.model for e in events if (r := getattr(e, "response", None)) is not None and r.model}
    assert named == {MODEL_NAME}


def test_models_retrieve(base_url: str) -> None:
    """``client.models.retrieve``: the id as sent (short or full, ``/`` and ``:`` included), through the hop
    too (the front's store is empty: it finds the model in its peer's list); OpenAI's 404 otherwise."""
    client = _client(base_url)
    for name in (MODEL_NAME, MODEL_REF):
        got = client.models.retrieve(name)
        assert got.id == name and got.object == "model" and (got.model_extra or {})["context_length"] > 0
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("docker.io/ai/nope:1b")
    assert missing.value.code == "model_not_found"


def test_responses_bad_input_item_is_openai_shaped(base_url: str) -> None:
    """llama-server's ``{"error": {"code": 400, ...}}`` reaches the client in OpenAI's shape (``code`` is a
    string or null there)."""
    with httpx.Client(base_url=base_url, timeout=120) as c:
        r = c.post("/v1/responses", json={"model": MODEL_NAME, "input": [{"type": "bogus"}]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] is None and err["param"] is None and err["type"] == "invalid_request_error"
    assert isinstance(err["message"], str) and err["message"]


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


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
         "tools[0].function"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": "x"}, "tools"),
        ({"messages": [{"role": "assistant", "tool_calls": "x"}, {"role": "user", "content": "x"}]},
         "messages[0].tool_calls"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
    ],
)
def test_malformed_chat_bodies_are_openai_400s(base_url: str, body: dict[str, object], param: str) -> None:
    """Shapes llama-server would answer with a 500 (or accept): OpenAI's 400, naming the param."""
    with pytest.raises(openai.BadRequestError) as bad:
        _client(base_url).chat.completions.create(model=MODEL_NAME, **body)  # type: ignore[call-overload]
    assert bad.value.param == param and bad.value.code is None
    assert bad.value.type == "invalid_request_error"


def test_capability_errors_on_v1(base_url: str) -> None:
    client = _client(base_url)
    tools: object = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    with pytest.raises(openai.BadRequestError, match=f"{MODEL_NAME} does not support tools"):
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
                                       tools=tools)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match=f'"{MODEL_NAME}" does not support thinking'):
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
                                       reasoning_effort="high")
    with pytest.raises(openai.BadRequestError, match=f"{MODEL_NAME} does not support tools"):
        client.responses.create(model=MODEL_NAME, input="x", tools=[  # type: ignore[list-item]
            {"type": "function", "name": "f", "parameters": {}}])
    # the agent model renders tools: the same request is served
    reply = client.chat.completions.create(model=AGENT_NAME, max_tokens=2, reasoning_effort="none",
                                           messages=[{"role": "user", "content": "x"}],
                                           tools=tools)  # type: ignore[arg-type]
    assert reply.choices[0].finish_reason in {"length", "stop", "tool_calls"}


WAV = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA="


@pytest.mark.parametrize(
    ("model", "messages", "message"),
    [
        # well-formed, but SmolLM2 has no audio projector: llama-server's 500 is the client's fault
        (MODEL_NAME, [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}]}],
         "audio input is not supported"),
        # arguments must be a string (they are), but llama-server parses them as JSON for this template
        (AGENT_NAME, [{"role": "user", "content": "x"},
                      {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                                            "function": {"name": "f", "arguments": "{bad"}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "r"}],
         "Failed to parse tool call arguments as JSON"),
    ],
)
def test_llama_server_500s_that_are_bad_requests_become_400s(base_url: str, model: str,
                                                             messages: list[object], message: str) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        _client(base_url).chat.completions.create(model=model, max_tokens=2,
                                                  messages=messages)  # type: ignore[arg-type]
    assert bad.value.status_code == 400 and bad.value.type == "invalid_request_error"
    assert message in bad.value.message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=openai_chat_bodies(MODEL_NAME) | openai_chat_bodies(AGENT_NAME))
def test_fuzzed_chat_shapes_never_500(base_url: str, body: bytes) -> None:
    r = httpx.post(base_url + "/v1/chat/completions", content=body, timeout=60)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str)
        if r.status_code == 400:
            assert err["type"] == "invalid_request_error"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies("model", "input", "tools", "instructions", "stream"),
       path=st.sampled_from(["/v1/responses", "/v1/responses/input_tokens"]))
def test_fuzzed_bodies_never_500(base_url: str, body: bytes, path: str) -> None:
    r = httpx.post(base_url + path, content=body, timeout=60)
    assert r.status_code < 500 or r.status_code == 501, r.text
    if r.status_code >= 400:
        assert isinstance(r.json()["error"]["message"], str)
