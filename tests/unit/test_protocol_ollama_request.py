"""Ollama /api/chat and /api/generate bodies -> llama-server requests."""

from __future__ import annotations

import base64
import re

import orjson
import pytest

from llmman.errors import BadRequest
from llmman.protocol.ollama.fields import RunnerOptions
from llmman.protocol.ollama.request import chat_request, generate_request, image_url, with_default_think

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 8).decode()
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\0" * 8).decode()
GIF = base64.b64encode(b"GIF89a" + b"\0" * 6).decode()
WEBP = base64.b64encode(b"RIFF\0\0\0\0WEBPVP8 ").decode()
STREAMING = {"stream": True, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize(
    ("b64", "url"),
    [
        (PNG, f"data:image/png;base64,{PNG}"),
        (JPEG, f"data:image/jpeg;base64,{JPEG}"),
        (GIF, f"data:image/gif;base64,{GIF}"),
        (WEBP, f"data:image/webp;base64,{WEBP}"),
        ("AAAA", "data:image/png;base64,AAAA"),
        ("data:image/jpeg;base64,/9j/", "data:image/jpeg;base64,/9j/"),
    ],
)
def test_image_url_sniffs_type(b64: str, url: str) -> None:
    assert image_url(b64) == url


def test_chat_minimal() -> None:
    req = chat_request({"model": "SmolLM2", "messages": [{"role": "User", "content": "hi"}]})
    assert req.path == "/v1/chat/completions"
    assert req.kind == "chat" and req.model == "SmolLM2"
    assert req.stream is True and req.is_load is False
    assert req.keep_alive is None and req.think is None
    assert req.runner == RunnerOptions() and req.ignored_options == ()
    assert req.body == {"model": "SmolLM2", "messages": [{"role": "user", "content": "hi"}], **STREAMING}


@pytest.mark.parametrize(("stream", "expected"), [(False, False), (True, True), (None, True)])
def test_client_stream_flag_but_upstream_always_streams(stream: object, expected: bool) -> None:
    req = chat_request({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": stream})
    assert req.stream is expected
    assert req.body["stream"] is True and req.body["stream_options"] == {"include_usage": True}


def test_chat_everything() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    body: dict[str, object] = {
        "model": "qwen3:0.6b",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "what is this?", "images": [JPEG]},
            {
                "role": "assistant",
                "content": "",
                "thinking": "hmm",
                "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
                    {"id": "call_keepme01", "function": {"index": 1, "name": "get_time", "arguments": {}}},
                ],
            },
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
            {"role": "tool", "content": "noon", "tool_call_id": "call_keepme01"},
        ],
        "tools": tools,
        "format": "json",
        "options": {"temperature": 0, "num_predict": 64, "num_ctx": 8192, "stream": False, "tfs_z": 1},
        "think": "low",
        "keep_alive": "10m",
        "stream": False,
    }
    req = chat_request(body)
    assert req.keep_alive == "10m" and req.think == "low" and req.stream is False
    assert req.runner == RunnerOptions(num_ctx=8192)
    assert req.ignored_options == ("stream", "tfs_z")
    assert req.body == {
        "model": "qwen3:0.6b",
        "temperature": 0,
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{JPEG}"}},
                ],
            },
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "hmm",
                "tool_calls": [
                    {
                        "id": "call_00002000",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Zürich"}'},
                    },
                    {
                        "id": "call_keepme01",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "call_00002000", "name": "get_weather"},
            {"role": "tool", "content": "noon", "tool_call_id": "call_keepme01"},
        ],
        "response_format": {"type": "json_object"},
        "tools": tools,
        "chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "low"},
        **STREAMING,
    }
    orjson.dumps(req.body)  # serialisable as is


def test_assistant_tool_call_message_without_content_and_string_arguments() -> None:
    req = chat_request(
        {
            "model": "m",
            "messages": [
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"a":1}'}}]},
            ],
        }
    )
    assert req.body["messages"] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_00000000", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
            ],
        }
    ]


def test_images_only_message_has_no_empty_text_part() -> None:
    req = chat_request({"model": "m", "messages": [{"role": "user", "images": [PNG]}]})
    assert req.body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}],
        }
    ]


@pytest.mark.parametrize("messages", [None, []])
def test_chat_empty_messages_is_a_load_request(messages: object) -> None:
    req = chat_request({"model": "m", "messages": messages, "keep_alive": 0})
    assert req.is_load is True and req.keep_alive == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": []}, "model is required"),
        ({"model": "m", "messages": "hi"}, "messages must be an array"),
        ({"model": "m", "messages": ["hi"]}, r"messages\[0\] must be an object"),
        ({"model": "m", "messages": [{"content": "hi"}]}, r"messages\[0\].role"),
        ({"model": "m", "messages": [{"role": 1, "content": "hi"}]}, r"messages\[0\].role"),
        ({"model": "m", "messages": [{"role": "user", "content": ["x"]}]}, "content must be a string"),
        ({"model": "m", "messages": [{"role": "user", "content": "x", "images": "AAAA"}]}, "images must be"),
        ({"model": "m", "messages": [{"role": "user", "content": "x", "images": [1]}]}, "images must be"),
        (
            {"model": "m", "messages": [{"role": "assistant", "tool_calls": {}}]},
            "tool_calls must be an array",
        ),
        (
            {"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
            "string name",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}
                ],
            },
            "arguments",
        ),
        ({"model": "m", "messages": [], "tools": {}}, "tools must be an array"),
        ({"model": "m", "messages": [], "stream": "yes"}, "stream must be a boolean"),
        ({"model": "m", "messages": [], "think": "maybe"}, "invalid think value"),
        ({"model": "m", "messages": [], "format": "xml"}, "invalid format"),
        ({"model": "m", "messages": [], "options": {"top_k": "a"}}, 'option "top_k" must be of type integer'),
        (
            {"model": "m", "messages": [], "logprobs": True, "top_logprobs": 21},
            "top_logprobs must be between",
        ),
        (
            {"model": "m", "messages": [], "logprobs": True, "top_logprobs": -1},
            "top_logprobs must be between",
        ),
        ({"model": "m", "messages": [], "logprobs": "y"}, "logprobs must be a boolean"),
    ],
)
def test_chat_bad_requests(body: dict[str, object], message: str) -> None:
    with pytest.raises(BadRequest, match=message) as err:
        chat_request(body)
    assert err.value.status == 400


def test_chat_logprobs_and_schema_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    req = chat_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "logprobs": True,
            "top_logprobs": 3,
            "format": schema,
            "think": False,
        }
    )
    assert req.body["logprobs"] is True and req.body["top_logprobs"] == 3
    assert req.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "schema", "schema": schema},
    }
    assert req.body["reasoning_effort"] == "none"
    assert req.body["chat_template_kwargs"] == {"enable_thinking": False}


def test_generate_becomes_chat_with_system_and_images() -> None:
    req = generate_request(
        {
            "model": "m",
            "prompt": "why?",
            "system": "sys",
            "images": [GIF],
            "think": True,
            "options": {"seed": 7},
            "template": "{{ .Prompt }}",
            "context": [1, 2],
        }
    )
    assert req.path == "/v1/chat/completions" and req.kind == "generate" and not req.is_load
    assert req.body == {
        "model": "m",
        "seed": 7,
        "messages": [
            {"role": "system", "content": "sys"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "why?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/gif;base64,{GIF}"}},
                ],
            },
        ],
        "chat_template_kwargs": {"enable_thinking": True},
        **STREAMING,
    }


@pytest.mark.parametrize(
    ("fmt", "extra"),
    [
        (None, {}),
        ("json", {"json_schema": {"type": "object"}}),
        ({"type": "array"}, {"json_schema": {"type": "array"}}),
    ],
)
def test_generate_raw_uses_completions(fmt: object, extra: dict[str, object]) -> None:
    req = generate_request(
        {
            "model": "m",
            "prompt": "Once",
            "raw": True,
            "format": fmt,
            "think": True,
            "options": {"num_predict": 3},
        }
    )
    assert req.path == "/v1/completions"
    assert req.body == {"model": "m", "max_tokens": 3, "prompt": "Once", **extra, **STREAMING}


def test_generate_raw_logprobs_is_an_integer_count() -> None:
    req = generate_request({"model": "m", "prompt": "a", "raw": True, "logprobs": True, "top_logprobs": 4})
    assert req.body["logprobs"] == 4 and "top_logprobs" not in req.body


@pytest.mark.parametrize(
    ("body", "is_load"),
    [
        ({}, True),
        ({"prompt": ""}, True),
        ({"prompt": "", "keep_alive": 0}, True),
        ({"prompt": "x"}, False),
        ({"images": [PNG]}, False),
    ],
)
def test_generate_load_detection(body: dict[str, object], is_load: bool) -> None:
    assert generate_request({"model": "m", **body}).is_load is is_load


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"raw": True, "system": "s"}, "raw mode does not support template, system, or context"),
        ({"raw": True, "template": "t"}, "raw mode does not support template, system, or context"),
        ({"raw": True, "context": [1]}, "raw mode does not support template, system, or context"),
        ({"raw": True, "prompt": "p", "images": [PNG]}, "raw mode does not support images"),
        ({"prompt": 3}, "prompt must be a string"),
        ({"system": ["s"]}, "system must be a string"),
        ({"raw": "yes"}, "raw must be a boolean"),
        ({"context": "1,2"}, "context must be an array"),
        ({"context": [1, 2, "x"]}, "context must be an array of integers"),
        ({"context": [1, True]}, "context must be an array of integers"),
        ({"context": [1.5]}, "context must be an array of integers"),
        ({"images": PNG}, "images must be an array"),
    ],
)
def test_generate_bad_requests(body: dict[str, object], message: str) -> None:
    with pytest.raises(BadRequest) as err:
        generate_request({"model": "m", **body})
    assert str(err.value) == message or message in str(err.value)


@pytest.mark.parametrize(
    ("body", "caps", "think", "kwargs"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, ("completion", "thinking"), True,
         {"enable_thinking": True}),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, ("completion",), None, None),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "think": False},
         ("completion", "thinking"), False, {"enable_thinking": False}),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "think": "low"},
         ("completion", "thinking"), "low", {"enable_thinking": True, "reasoning_effort": "low"}),
        ({"model": "m", "messages": []}, ("completion", "thinking"), None, None),  # a load: nothing to think
    ],
)
def test_thinking_is_on_by_default_for_thinking_models(body: dict[str, object], caps: tuple[str, ...],
                                                       think: object, kwargs: object) -> None:  # fmt: skip
    req = with_default_think(chat_request(body), caps)
    assert req.think == think and req.body.get("chat_template_kwargs") == kwargs


def test_default_think_also_for_generate_but_not_raw() -> None:
    caps = ("completion", "thinking")
    req = with_default_think(generate_request({"model": "m", "prompt": "hi"}), caps)
    assert req.think is True and req.body["chat_template_kwargs"] == {"enable_thinking": True}
    raw = with_default_think(generate_request({"model": "m", "prompt": "hi", "raw": True}), caps)
    assert raw.think is None and "chat_template_kwargs" not in raw.body


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ([{"type": "function"}], "tools[0].function"),
        ([{"type": "function", "function": {"name": 5}}], "tools[0].function.name"),
        ([{"function": {"name": "f"}}], "tools[0].type"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], "tools[0].function.parameters"),
    ],
)
def test_chat_tools_are_checked_before_llama_server_sees_them(tools: object, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        chat_request({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools})
