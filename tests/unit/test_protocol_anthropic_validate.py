"""Table tests of the Anthropic request checks (protocol/anthropic_validate.py), the thinking mapping and
the server-tool clean-up (protocol/anthropic.py)."""

from __future__ import annotations

from typing import Any

import pytest

from llmman.errors import BadRequest
from llmman.protocol.anthropic.messages import apply_thinking, prepare_request
from llmman.protocol.anthropic.validate import forced_tool, validate_request

HI = [{"role": "user", "content": "hi"}]
TOOL = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}
ROUND = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": [USE]},
         {"role": "user", "content": [RESULT]}]
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "messages": HI, **fields}


@pytest.mark.parametrize(
    "good",
    [
        body(),
        body(messages=ROUND, tools=[TOOL]),
        body(messages=[*ROUND[:2]], tools=[TOOL]),  # an unanswered tool_use in the last turn: a prefill
        body(system="be brief", stop_sequences=["\n"], temperature=0, top_p=1, top_k=5, stream=True,
             metadata={"user_id": "u"}),
        body(system=[{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]),
        body(messages=[{"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE,
                                                    {"type": "image", "source": {"type": "url", "url": "http://x"}}]}]),
        body(messages=[{"role": "user", "content": [{"type": "document", "source": {
            "type": "text", "media_type": "text/plain", "data": "doc"}}]}]),
        body(messages=[*HI, {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": ""},
            {"type": "redacted_thinking", "data": "x"},
            {"type": "text", "text": "ok"}]}, {"role": "user", "content": "go"}]),
        body(messages=[*ROUND[:2], {"role": "user", "content": [
            {**RESULT, "content": [{"type": "text", "text": "Sunny"}, IMAGE], "is_error": False}]}],
             tools=[TOOL]),
        body(tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"}),
        body(tools=[TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True}),
        body(tools=[TOOL, {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
             tool_choice={"type": "auto"}),
        body(tool_choice={"type": "none"}),
        body(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024}),
        body(thinking={"type": "disabled"}),
        body(thinking={"type": "adaptive"}),
        body(messages=[{"role": "system", "content": "moved"}, *HI]),
        body(messages=[*ROUND[:2], {"role": "system", "content": "between"}, ROUND[2]], tools=[TOOL]),
    ],
)
def test_valid_bodies_pass(good: dict[str, Any]) -> None:
    validate_request(good)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (None, "The request body is not a JSON object"),
        ({"max_tokens": 4, "messages": HI}, "model: Field required"),
        ({"model": 5, "max_tokens": 4, "messages": HI}, "model: Input should be a valid string"),
        ({"model": "m", "messages": HI}, "max_tokens: Field required"),
        (body(max_tokens=0), "max_tokens: Input should be greater than or equal to 1"),
        (body(max_tokens=-1), "max_tokens: Input should be greater than or equal to 1"),
        (body(max_tokens=True), "max_tokens: Input should be a valid integer"),
        (body(max_tokens="8"), "max_tokens: Input should be a valid integer"),
        (body(max_tokens=2**40), "max_tokens: Input should be less than or equal to 2147483647"),
        (body(messages=None), "messages: Field required"),
        (body(messages={}), "messages: Input should be a valid list"),
        (body(messages=[]), "messages: at least one message is required"),
        (body(messages=[1]), "messages.0: Input should be a valid dictionary"),
        (body(messages=[{"content": "x"}]), "messages.0.role: Field required"),
        (body(messages=[{"role": "tool", "content": "x"}]),
         "messages.0.role: Input should be 'user' or 'assistant'"),
        (body(messages=[{"role": "user"}]), "messages.0.content: Field required"),
        (body(messages=[{"role": "user", "content": 3}]),
         "messages.0.content: Input should be a valid string"),
        (body(messages=[{"role": "user", "content": [1]}]),
         "messages.0.content.0: Input should be a valid dict"),
        (body(messages=[{"role": "user", "content": [{"type": "bogus"}]}]),
         "messages.0.content.0.type: Input tag 'bogus' found using 'type' does not match any of the expected "
         "tags: 'text', 'image'"),
        (body(messages=[{"role": "user", "content": [{"text": "x"}]}]),
         "messages.0.content.0.type: Input should"),
        (body(messages=[{"role": "user", "content": [{"type": "text"}]}]),
         "messages.0.content.0.text: Field required"),
        (body(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
         "messages.0.content.0.text: Input should be a valid string"),
        (body(messages=[{"role": "user", "content": [{"type": "image"}]}]),
         "messages.0.content.0.source: Field required"),
        (body(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]),
         "messages.0.content.0.source.type: Input tag 'file'"),
        (body(messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "data": "A"}}]}]),
         "messages.0.content.0.source.media_type: Field required"),
        (body(messages=[{"role": "user", "content": [{"type": "tool_result"}]}]),
         "messages.0.content.0.tool_use_id: Field required"),
        (body(messages=[*ROUND[:2], {"role": "user", "content": [{**RESULT, "content": 5}]}], tools=[TOOL]),
         "messages.2.content.0.content: Input should be a valid string or a list"),
        (body(messages=[*ROUND[:2], {"role": "user", "content": [
            {**RESULT, "content": [{"type": "tool_use"}]}]}], tools=[TOOL]),
         "messages.2.content.0.content.0.type: Input tag 'tool_use'"),
        (body(messages=[*ROUND[:2], {"role": "user", "content": [{**RESULT, "is_error": "no"}]}],
              tools=[TOOL]),
         "messages.2.content.0.is_error: Input should be a valid boolean"),
        (body(messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]),
         "messages.0.content.0.input: Field required"),
        (body(messages=[{"role": "assistant", "content": [{**USE, "input": "x"}]}]),
         "messages.0.content.0.input: Input should be a valid dictionary"),
        (body(messages=[{"role": "user", "content": [USE]}]),
         "messages.0.content.0: `tool_use` blocks can only be in `assistant` messages"),
        (body(messages=[{"role": "assistant", "content": [RESULT]}]),
         "messages.0.content.0: `tool_result` blocks can only be in `user` messages"),
        (body(messages=[{"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}]),
         "messages.0.content.0.signature: Field required"),
        (body(messages=[{"role": "user", "content": [RESULT]}]),
         "messages.0.content: unexpected `tool_use_id` found in `tool_result` blocks: toolu_1. Each "
         "`tool_result` block must have a corresponding `tool_use` block in the previous message."),
        (body(messages=[*ROUND[:2], {"role": "user", "content": "and?"}], tools=[TOOL]),
         "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1."),
        (body(messages=[{"role": "system", "content": [IMAGE]}, *HI]),
         "messages.0.content.0.type: a system message may only hold text blocks"),
        (body(system=5), "system: Input should be a valid string or a list of text blocks"),
        (body(system=[{"type": "text"}]), "system.0.text: Field required"),
        (body(system=[{"type": "image"}]), "system.0.type: Input tag 'image'"),
        (body(stop_sequences="x"), "stop_sequences: Input should be a valid list"),
        (body(stop_sequences=["a", 5]), "stop_sequences.1: Input should be a valid string"),
        (body(stream="yes"), "stream: Input should be a valid boolean"),
        (body(temperature="x"), "temperature: Input should be a valid number"),
        (body(temperature=1.5), "temperature: Input should be less than or equal to 1"),
        (body(top_p=-0.1), "top_p: Input should be greater than or equal to 0"),
        (body(top_k=1.5), "top_k: Input should be a valid integer"),
        (body(metadata=[]), "metadata: Input should be a valid dictionary"),
        (body(tools="x"), "tools: Input should be a valid list"),
        (body(tools=[1]), "tools.0: Input should be a valid dictionary"),
        (body(tools=[{"input_schema": {}}]), "tools.0.name: Field required"),
        (body(tools=[{"name": 5, "input_schema": {}}]), "tools.0.name: Input should be a valid string"),
        (body(tools=[{"name": "bad name", "input_schema": {}}]), "tools.0.name: String should match pattern"),
        (body(tools=[{"name": "f"}]), "tools.0.input_schema: Field required"),
        (body(tools=[{"name": "f", "input_schema": "x"}]),
         "tools.0.input_schema: Input should be a valid dict"),
        (body(tools=[{**TOOL, "description": 5}]), "tools.0.description: Input should be a valid string"),
        (body(tool_choice="auto"), "tool_choice: Input should be a valid dictionary"),
        (body(tool_choice={"type": "bogus"}), "tool_choice.type: Input tag 'bogus'"),
        (body(tools=[TOOL], tool_choice={"type": "tool"}), "tool_choice.name: Field required"),
        (body(tools=[TOOL], tool_choice={"type": "tool", "name": "other"}),
         "tool_choice.name: tool 'other' is not one of the request's tools"),
        (body(tool_choice={"type": "any"}), "tool_choice: tool_choice.type 'any' needs at least one tool"),
        (body(tools=[TOOL], tool_choice={"type": "auto", "disable_parallel_tool_use": "y"}),
         "tool_choice.disable_parallel_tool_use: Input should be a valid boolean"),
        (body(thinking="x"), "thinking: Input should be a valid dictionary"),
        (body(thinking={"type": "on"}), "thinking.type: Input tag 'on'"),
        (body(thinking={"type": "enabled"}), "thinking.enabled.budget_tokens: Field required"),
        (body(thinking={"type": "enabled", "budget_tokens": "x"}),
         "budget_tokens: Input should be a valid integer"),
        (body(thinking={"type": "enabled", "budget_tokens": 100}),
         "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"),
        (body(max_tokens=1024, thinking={"type": "enabled", "budget_tokens": 1024}),
         "`max_tokens` must be greater than `thinking.budget_tokens`"),
        (body(max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 1024}, tools=[TOOL],
              tool_choice={"type": "any"}), "Thinking may not be enabled when tool_choice forces tool use."),
    ],
)
def test_bad_bodies_answer_anthropics_words(bad: Any, message: str) -> None:
    with pytest.raises(BadRequest) as err:
        validate_request(bad)
    assert err.value.status == 400 and message in err.value.message, err.value.message


def test_count_tokens_takes_no_max_tokens_but_checks_the_rest() -> None:
    validate_request({"model": "m", "messages": HI, "tools": [TOOL]}, count_tokens=True)
    validate_request({"model": "m", "messages": HI, "thinking": {"type": "enabled", "budget_tokens": 2048}},
                     count_tokens=True)
    with pytest.raises(BadRequest, match=r"messages\.0\.content\.0\.text: Field required"):
        validate_request({"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
                         count_tokens=True)


def test_prepare_request_drops_server_tools() -> None:
    out, _ = prepare_request(body(tools=[TOOL, {"type": "web_search_20250305", "name": "web_search"}]))
    assert out["tools"] == [TOOL]
    only_server, _ = prepare_request(body(tools=[{"type": "bash_20250124", "name": "bash"}],
                                          tool_choice={"type": "auto"}))
    assert "tools" not in only_server and "tool_choice" not in only_server
    with pytest.raises(BadRequest, match="at least one user or assistant message"):
        prepare_request(body(messages=[{"role": "system", "content": "only"}]))


@pytest.mark.parametrize(
    ("thinking", "can_think", "kwargs", "kept"),
    [
        (None, True, None, False),
        ({"type": "enabled", "budget_tokens": 2048}, True, {"enable_thinking": True}, True),
        ({"type": "adaptive"}, True, {"enable_thinking": True}, False),
        ({"type": "disabled"}, True, {"enable_thinking": False}, False),
        ({"type": "enabled", "budget_tokens": 2048}, False, None, False),  # relaxed, not refused
        ({"type": "disabled"}, False, None, False),
    ],
)
def test_apply_thinking(thinking: dict[str, Any] | None, can_think: bool, kwargs: dict[str, bool] | None,
                        kept: bool) -> None:  # fmt: skip
    prepared = body(max_tokens=4096, **({"thinking": thinking} if thinking else {}))
    out = apply_thinking(prepared, can_think)
    assert out.get("chat_template_kwargs") == kwargs
    assert ("thinking" in out) is kept
    if kept:
        assert out["thinking"] == thinking  # llama-server maps budget_tokens to its reasoning budget


def test_apply_thinking_keeps_the_clients_own_template_kwargs() -> None:
    out = apply_thinking(body(thinking={"type": "disabled"}, chat_template_kwargs={"enable_thinking": True,
                                                                                    "x": 1}), True)
    assert out["chat_template_kwargs"] == {"enable_thinking": True, "x": 1}


def test_forced_tool() -> None:
    other = {"name": "other", "input_schema": {"type": "object"}}
    server = {"type": "web_search_20250305", "name": "web_search"}
    assert forced_tool(body(tools=[TOOL, other], tool_choice={"type": "tool", "name": "other"})) == [other]
    assert forced_tool(body(tools=[TOOL, other, server], tool_choice={"type": "any"})) == [TOOL, other]
    assert forced_tool(body(tools=[TOOL], tool_choice={"type": "auto"})) is None
    assert forced_tool(body(tools=[TOOL])) is None
