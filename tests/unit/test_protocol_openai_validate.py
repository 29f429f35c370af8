"""Table tests of the OpenAI request checks (protocol/openai_validate.py) and of the rule that turns
llama-server's request-conversion 500s into 400s (protocol/openai.py ``client_fault``)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmman.protocol.openai.shapes import client_fault, remap_upstream_error
from llmman.protocol.openai.validate import (
    InvalidParam,
    validate_chat,
    validate_completion,
    validate_embeddings,
    validate_tools,
)

HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    "body",
    [
        {"messages": HI},
        {"messages": [{"role": "system", "content": "s"}, {"role": "developer", "content": [
            {"type": "text", "text": "d"}]}, *HI]},
        {"messages": [*HI, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "42"}]},
        {"messages": [*HI, {"role": "assistant", "content": None, "tool_calls": [  # object arguments too
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "42"}]},
        {"messages": [{"role": "assistant"}, *HI]},
        {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "image_url", "image_url": "https://x/y.png"},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]},
        {"messages": HI, "tools": [TOOL], "tool_choice": "required"},
        {"messages": HI, "tools": [TOOL],
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {"messages": HI, "temperature": 0, "top_p": 1, "max_tokens": -1, "n": 1, "stream": False,
         "stop": ["\n", "."], "seed": 3, "stream_options": {"include_usage": True}, "logprobs": True,
         "top_logprobs": 20, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}},
         "presence_penalty": -2, "frequency_penalty": 2.0, "reasoning_effort": "none", "user": "u"},
        {"messages": HI, "temperature": None, "stop": None, "tools": None, "n": None},  # null = absent
        {"messages": HI, "stop": "END", "chat_template_kwargs": {"x": 1}, "unknown_field": [1]},
    ],
)
def test_valid_chat_bodies_pass(body: dict[str, Any]) -> None:
    validate_chat(body)


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({}, "messages", "Missing required parameter: 'messages'."),
        ({"messages": "hi"}, "messages",
         "Invalid type for 'messages': expected an array, but got a string instead."),
        ({"messages": []}, "messages", "[] is too short - 'messages'"),
        ({"messages": [1]}, "messages[0]", "Invalid type for 'messages[0]': expected an object, but got an "
         "integer instead."),
        ({"messages": [{"content": "x"}]}, "messages[0].role",
         "Missing required parameter: 'messages[0].role'."),
        ({"messages": [{"role": 5, "content": "x"}]}, "messages[0].role",
         "Invalid type for 'messages[0].role': expected a string, but got an integer instead."),
        ({"messages": [{"role": "bogus", "content": "x"}]}, "messages[0].role",
         "Invalid value: 'bogus'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', "
         "and 'developer'."),
        ({"messages": [{"role": "user"}]}, "messages[0].content",
         "Missing required parameter: 'messages[0].content'."),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content",
         "Invalid type for 'messages[0].content': expected one of a string or array of objects, but got an "
         "integer instead."),
        ({"messages": [{"role": "user", "content": [1]}]}, "messages[0].content[0]", "expected an object"),
        ({"messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages[0].content[0].type",
         "Missing required parameter"),
        ({"messages": [{"role": "user", "content": [{"type": "nope"}]}]}, "messages[0].content[0].type",
         "Invalid value: 'nope'"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text",
         "Missing required parameter"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
         "messages[0].content[0].text", "expected a string, but got an integer"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content[0].image_url", "Missing"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         "messages[0].content[0].image_url.url", "Missing"),
        ({"messages": [{"role": "user", "content": "x", "name": 5}]}, "messages[0].name",
         "expected a string"),
        ({"messages": [{"role": "assistant", "tool_calls": "x"}]}, "messages[0].tool_calls",
         "expected an array, but got a string"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]},
         "messages[0].tool_calls[0].type", "Missing"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}]},
         "messages[0].tool_calls[0].function.name", "Missing"),
        ({"messages": [{"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": [1]}}]}]},
         "messages[0].tool_calls[0].function.arguments", "expected a string, but got an array"),
        ({"messages": HI, "tools": "x"}, "tools", "expected an array, but got a string"),
        ({"messages": HI, "tools": [1]}, "tools[0]", "expected an object"),
        ({"messages": HI, "tools": [{"type": "function"}]}, "tools[0].function", "Missing"),
        ({"messages": HI, "tools": [{"function": {"name": "f"}}]}, "tools[0].type", "Missing"),
        ({"messages": HI, "tools": [{"type": "web", "function": {"name": "f"}}]}, "tools[0].type",
         "Invalid value: 'web'. Supported values are: 'function'."),
        ({"messages": HI, "tools": [{"type": "function", "function": {"name": 5}}]}, "tools[0].function.name",
         "expected a string, but got an integer"),
        ({"messages": HI, "tools": [{"type": "function", "function": {"name": ""}}]},
         "tools[0].function.name", "empty string"),
        ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
         "tools[0].function.parameters", "expected an object"),
        ({"messages": HI, "tool_choice": "bogus"}, "tool_choice", "Invalid value: 'bogus'"),
        ({"messages": HI, "tool_choice": 5}, "tool_choice", "expected one of a string or object"),
        ({"messages": HI, "tool_choice": {"type": "function"}}, "tool_choice.function.name", "Missing"),
        ({"messages": HI, "temperature": "hot"}, "temperature", "expected a number, but got a string"),
        ({"messages": HI, "temperature": 3}, "temperature",
         "Invalid 'temperature': value above maximum value. Expected a value <= 2, but got 3 instead."),
        ({"messages": HI, "temperature": -0.5}, "temperature", "value below minimum value"),
        ({"messages": HI, "top_p": [1]}, "top_p", "expected a number, but got an array"),
        ({"messages": HI, "max_tokens": "2"}, "max_tokens", "expected an integer, but got a string"),
        ({"messages": HI, "max_tokens": 2.5}, "max_tokens", "expected an integer, but got a decimal"),
        ({"messages": HI, "max_tokens": True}, "max_tokens", "expected an integer, but got a boolean"),
        ({"messages": HI, "stream": "yes"}, "stream", "expected a boolean, but got a string"),
        ({"messages": HI, "stream_options": 5}, "stream_options", "expected an object"),
        ({"messages": HI, "stop": 5}, "stop", "expected one of a string or array of strings"),
        ({"messages": HI, "stop": ["a", 5]}, "stop[1]", "expected a string, but got an integer"),
        ({"messages": HI, "n": "2"}, "n", "expected an integer"),
        ({"messages": HI, "n": 0}, "n", "value below minimum value"),
        ({"messages": HI, "seed": "x"}, "seed", "expected an integer"),
        ({"messages": HI, "logprobs": "x"}, "logprobs", "expected a boolean"),
        ({"messages": HI, "top_logprobs": 21}, "top_logprobs", "value above maximum value"),
        ({"messages": HI, "response_format": 5}, "response_format", "expected an object"),
        ({"messages": HI, "response_format": {"type": "bogus"}}, "response_format.type", "Invalid value"),
        ({"messages": HI, "response_format": {"type": "json_schema"}}, "response_format.json_schema",
         "Missing"),
        ({"messages": HI, "parallel_tool_calls": "x"}, "parallel_tool_calls", "expected a boolean"),
        ({"messages": HI, "reasoning_effort": 5}, "reasoning_effort", "expected a string"),
        ({"messages": HI, "reasoning_effort": "huge"}, "reasoning_effort", "Invalid value: 'huge'"),
        ({"messages": HI, "logit_bias": [1]}, "logit_bias", "expected an object"),
    ],
)
def test_bad_chat_bodies_name_the_param(body: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(InvalidParam) as err:
        validate_chat(body)
    assert err.value.status == 400 and err.value.param == param
    assert message in err.value.message


def test_validate_tools_alone() -> None:
    validate_tools(None)
    validate_tools([TOOL])
    with pytest.raises(InvalidParam, match=r"tools\[1\]\.function"):
        validate_tools([TOOL, {"type": "function", "function": []}])


@pytest.mark.parametrize("prompt", ["hi", ["a", "b"], [1, 2, 3], [[1, 2], [3]], ""])
def test_valid_completion_prompts(prompt: object) -> None:
    validate_completion({"prompt": prompt, "max_tokens": 3, "echo": False, "logprobs": 2})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": [{"a": 1}]}, "prompt[0]"),
        ({"prompt": [[1, "x"]]}, "prompt[0]"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "stream": 1}, "stream"),
        ({"prompt": "x", "logprobs": 9}, "logprobs"),
        ({"prompt": "x", "echo": "yes"}, "echo"),
        ({"prompt": "x", "suffix": 1}, "suffix"),
    ],
)
def test_bad_completion_bodies(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidParam) as err:
        validate_completion(body)
    assert err.value.param == param


@pytest.mark.parametrize(
    ("body", "dimensions"),
    [
        ({"input": "x"}, None),
        ({"input": ["a", "b"], "dimensions": 8, "encoding_format": "base64"}, 8),
        ({"input": [1, 2], "encoding_format": "float", "dimensions": None}, None),
        ({"input": [[1, 2], [3]], "dimensions": 1}, 1),
    ],
)
def test_valid_embeddings(body: dict[str, Any], dimensions: int | None) -> None:
    assert validate_embeddings(body) == dimensions


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({}, "input", "Missing required parameter: 'input'."),
        ({"input": 5}, "input", "expected one of a string"),
        ({"input": []}, "input", "empty array"),
        ({"input": [{"a": 1}]}, "input[0]", "expected a string"),
        ({"input": [[]]}, "input[0]", "expected a string"),
        ({"input": "x", "dimensions": 0}, "dimensions",
         "Invalid 'dimensions': integer below minimum value. Expected a value >= 1, but got 0 instead."),
        ({"input": "x", "dimensions": -8}, "dimensions", "but got -8 instead"),
        ({"input": "x", "dimensions": "8"}, "dimensions", "expected an integer, but got a string"),
        ({"input": "x", "dimensions": 8.0}, "dimensions", "expected an integer, but got a decimal"),
        ({"input": "x", "dimensions": True}, "dimensions", "expected an integer, but got a boolean"),
        ({"input": "x", "encoding_format": "bogus"}, "encoding_format",
         "Invalid value: 'bogus'. Supported values are: 'float' and 'base64'."),
        ({"input": "x", "encoding_format": 5}, "encoding_format", "Invalid value: '5'"),
    ],
)
def test_bad_embeddings(body: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(InvalidParam) as err:
        validate_embeddings(body)
    assert err.value.param == param and message in err.value.message


def _err(status: int, message: str, kind: str = "server_error") -> bytes:
    return orjson.dumps({"error": {"code": status, "message": message, "type": kind}})


@pytest.mark.parametrize(
    ("status", "message", "fault"),
    [
        (500, "Failed to parse messages: Missing 'role' in message: {\"content\":\"x\"}", True),
        (500, "Failed to parse tools: Missing tool function: {\"type\":\"function\"}", True),
        (500, "image input is not supported - hint: if this is unexpected, you may need to provide the "
         "mmproj", True),
        (500, "tools param requires --jinja flag", True),
        (500, "input (600 tokens) is too large to process. increase the physical batch size", True),
        (500, "Context size has been exceeded.", False),  # a runtime failure, not the request's
        (500, "llama-server process has terminated", False),
        (503, "Loading model", False),
        (400, "Failed to parse messages: x", False),  # already a 400: nothing to change
        (502, "Failed to parse messages: x", False),
        (500, "something Failed to parse messages", False),  # the text must begin with it
    ],
)
def test_client_fault_rule(status: int, message: str, fault: bool) -> None:
    assert client_fault(status, message) is fault


def test_remap_upstream_error() -> None:
    body = _err(500, "Failed to parse tools: Missing tool type: 1")
    assert remap_upstream_error(500, body) == (400, orjson.dumps({"error": {
        "message": "Failed to parse tools: Missing tool type: 1", "type": "invalid_request_error",
        "param": None, "code": None}}))
    runtime = _err(500, "Context size has been exceeded.")
    assert remap_upstream_error(500, runtime) == (500, orjson.dumps({"error": {
        "message": "Context size has been exceeded.", "type": "server_error", "param": None, "code": None}}))
    assert remap_upstream_error(500, b"not json") == (500, b"not json")
    assert remap_upstream_error(200, b'{"choices": []}') == (200, b'{"choices": []}')


def test_llama_server_error_shape_becomes_openais() -> None:
    """OpenAI's ``code`` is a string or null: llama-server's integer status there is dropped, the status
    line and its extra fields are kept; bodies already in OpenAI's shape pass unchanged."""
    bogus = _err(400, "Unsupported input item type: bogus", "invalid_request_error")
    assert remap_upstream_error(400, bogus) == (400, orjson.dumps({"error": {
        "message": "Unsupported input item type: bogus", "type": "invalid_request_error", "param": None,
        "code": None}}))
    long = orjson.dumps({"error": {"code": 400, "message": "request (9 tokens) exceeds the available context",
                                   "type": "exceed_context_size_error", "n_prompt_tokens": 9, "n_ctx": 8}})
    status, body = remap_upstream_error(400, long)
    assert status == 400 and orjson.loads(body)["error"] == {
        "message": "request (9 tokens) exceeds the available context", "type": "exceed_context_size_error",
        "param": None, "code": None, "n_prompt_tokens": 9, "n_ctx": 8}
    ours = orjson.dumps({"error": {"message": "x", "type": "invalid_request_error", "param": None,
                                   "code": "model_not_found"}})
    assert remap_upstream_error(404, ours) == (404, ours)
    assert remap_upstream_error(503, b'{"error": "Loading model"}') == (503, b'{"error": "Loading model"}')
