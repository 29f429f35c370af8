"""Ollama request fields: body, model, options, format, think."""

from __future__ import annotations

import pytest

from llmman.errors import BadRequest
from llmman.protocol.ollama.fields import (
    RunnerOptions,
    format_to_response_format,
    options_to_sampling,
    parse_json_body,
    require_model,
    runner_options,
    think_fields,
    unknown_options,
    validate_think,
)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "missing request body"),
        (b"  \n", "missing request body"),
        (b"{", "invalid JSON"),
        (b'{"model": "\xff"}', "invalid JSON"),
        (b"[1]", "must be a JSON object"),
        (b'"x"', "must be a JSON object"),
        (b"null", "must be a JSON object"),
    ],
)
def test_parse_json_body_errors(raw: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message) as err:
        parse_json_body(raw)
    assert err.value.status == 400


def test_parse_json_body_ok() -> None:
    assert parse_json_body('{"model": "日本"}'.encode()) == {"model": "日本"}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({}, "model is required"),
        ({"model": ""}, "model is required"),
        ({"model": None}, "model is required"),
        ({"model": 3}, "model must be a string"),
        ({"model": ["a"]}, "model must be a string"),
    ],
)
def test_require_model_errors(body: dict[str, object], error: str) -> None:
    with pytest.raises(BadRequest, match=error):
        require_model(body)


def test_require_model_returns_the_string_as_sent() -> None:
    assert require_model({"model": "SmolLM2:Latest"}) == "SmolLM2:Latest"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (None, {}),
        ({}, {}),
        (
            {"temperature": 0, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "typical_p": 1},
            {"temperature": 0, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "typical_p": 1},
        ),
        (
            {"repeat_penalty": 1.1, "repeat_last_n": 64, "presence_penalty": 0.5, "frequency_penalty": -0.5},
            {"repeat_penalty": 1.1, "repeat_last_n": 64, "presence_penalty": 0.5, "frequency_penalty": -0.5},
        ),
        ({"seed": 42, "stop": ["\n", "User:"]}, {"seed": 42, "stop": ["\n", "User:"]}),
        ({"stop": "END"}, {"stop": ["END"]}),
        ({"num_predict": 128}, {"max_tokens": 128}),
        ({"num_predict": 0}, {"max_tokens": 0}),
        ({"num_predict": -1}, {}),
        ({"num_predict": -2}, {}),
        (
            {"mirostat": 2, "mirostat_tau": 5, "mirostat_eta": 0.1},
            {"mirostat": 2, "mirostat_tau": 5, "mirostat_eta": 0.1},
        ),
        ({"num_keep": 4}, {"n_keep": 4}),
        ({"top_k": 40.0}, {"top_k": 40}),
        ({"temperature": None}, {}),
        ({"num_ctx": 8192, "num_gpu": 0, "tfs_z": 1.0, "numa": True}, {}),
    ],
)
def test_options_to_sampling(options: object, expected: dict[str, object]) -> None:
    out = options_to_sampling(options)
    assert out == expected
    assert all(type(out[k]) is type(v) for k, v in expected.items())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_k": "40"}, 'option "top_k" must be of type integer'),
        ({"top_k": True}, 'option "top_k" must be of type integer'),
        ({"top_k": 1.5}, 'option "top_k" must be of type integer'),
        ({"seed": False}, 'option "seed" must be of type integer'),
        ({"num_predict": "10"}, 'option "num_predict" must be of type integer'),
        ({"temperature": "hot"}, 'option "temperature" must be of type float'),
        ({"temperature": True}, 'option "temperature" must be of type float'),
        ({"stop": [1]}, 'option "stop" must be of type array of strings'),
        ({"stop": {"a": 1}}, 'option "stop" must be of type array of strings'),
        ({"num_ctx": "big"}, 'option "num_ctx" must be of type integer'),
        ({"use_mmap": 1}, 'option "use_mmap" must be of type boolean'),
        ([1], "options must be an object"),
        ("x", "options must be an object"),
    ],
)
def test_option_type_errors(options: object, message: str) -> None:
    with pytest.raises(BadRequest) as err:
        options_to_sampling(options)
        runner_options(options)
    assert str(err.value) == message
    assert err.value.status == 400


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (None, RunnerOptions()),
        ({"temperature": 0.1}, RunnerOptions()),
        (
            {"num_ctx": 8192, "num_batch": 512, "num_gpu": 0, "main_gpu": 1, "num_thread": 4},
            RunnerOptions(num_ctx=8192, num_batch=512, num_gpu=0, main_gpu=1, num_thread=4),
        ),
        (
            {"use_mmap": False, "use_mlock": True, "num_ctx": 4096.0},
            RunnerOptions(num_ctx=4096, use_mmap=False, use_mlock=True),
        ),
        ({"num_ctx": None}, RunnerOptions()),
    ],
)
def test_runner_options(options: object, expected: RunnerOptions) -> None:
    assert runner_options(options) == expected


def test_unknown_options_are_reported_not_rejected() -> None:
    options = {"temperature": 0.1, "num_ctx": 1, "tfs_z": 1.0, "numa": False, "penalize_newline": True}
    assert unknown_options(options) == ("tfs_z", "numa", "penalize_newline")
    assert unknown_options(None) == ()


SCHEMA = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        (None, None),
        ("", None),
        ("json", {"type": "json_object"}),
        (SCHEMA, {"type": "json_schema", "json_schema": {"name": "schema", "schema": SCHEMA}}),
    ],
)
def test_format_mapping(fmt: object, expected: object) -> None:
    assert format_to_response_format(fmt) == expected


@pytest.mark.parametrize("fmt", ["yaml", "JSON", 1, True, ["json"]])
def test_format_errors(fmt: object) -> None:
    with pytest.raises(BadRequest, match="invalid format"):
        format_to_response_format(fmt)


@pytest.mark.parametrize(
    ("think", "fields"),
    [
        (None, {}),
        (False, {"chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "none"}),
        (True, {"chat_template_kwargs": {"enable_thinking": True}}),
        ("low", {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "low"}}),
        ("medium", {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "medium"}}),
        ("high", {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "high"}}),
        ("max", {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "high"}}),
    ],
)
def test_think_mapping(think: object, fields: dict[str, object]) -> None:
    assert think_fields(validate_think(think)) == fields


@pytest.mark.parametrize("think", ["yes", "HIGH", "none", 1, 0, [], {}])
def test_think_errors(think: object) -> None:
    with pytest.raises(BadRequest, match="invalid think value"):
        validate_think(think)
