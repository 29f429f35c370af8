"""OpenAI dialect helpers: error bodies, request peeking, /v1/models."""

from __future__ import annotations

from dataclasses import dataclass

import openai
import pytest
from openai.types.shared import ErrorObject

from llmman.errors import BadRequest
from llmman.protocol.openai.shapes import ModelEntry, models_list, openai_error, peek_model, wants_stream


@pytest.mark.parametrize(
    ("status", "type_"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (409, "invalid_request_error"),
        (429, "rate_limit_error"),
        (499, "invalid_request_error"),
        (500, "server_error"),
        (501, "not_supported_error"),
        (502, "server_error"),
        (503, "unavailable_error"),
    ],
)
def test_openai_error_types(status: int, type_: str) -> None:
    assert openai_error("boom", status=status) == {
        "error": {"message": "boom", "type": type_, "param": None, "code": None}
    }


def test_openai_error_overrides() -> None:
    body = openai_error("model 'x' not found", status=404, type_="custom", code="model_not_found")
    assert body["error"] == {
        "message": "model 'x' not found",
        "type": "custom",
        "param": None,
        "code": "model_not_found",
    }


@pytest.mark.parametrize(
    ("raw", "model", "stream"),
    [
        (b'{"model": "smollm2", "messages": []}', "smollm2", False),
        (b'{"model": "a/b:c", "stream": true}', "a/b:c", True),
        (b'{"model": "m", "stream": "true"}', "m", False),
    ],
)
def test_peek_model(raw: bytes, model: str, stream: bool) -> None:
    body, got = peek_model(raw)
    assert got == model and body["model"] == model
    assert wants_stream(body) is stream


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "could not parse the JSON body"),
        (b"{", "could not parse the JSON body"),
        (b"[]", "could not parse the JSON body"),
        (b"\xff", "could not parse the JSON body"),
        (b"{}", "you must provide a model parameter"),
        (b'{"model": ""}', "you must provide a model parameter"),
        (b'{"model": 5}', "you must provide a model parameter"),
    ],
)
def test_peek_model_errors(raw: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message) as err:
        peek_model(raw)
    assert err.value.status == 400


@dataclass
class _Attrs:
    id: str
    created: int
    context_length: int | None


def test_models_list_accepts_dataclasses_dicts_and_objects() -> None:
    body = models_list(
        [
            ModelEntry("smollm2:latest", 1700000000, 8192),
            {"id": "gemma3:270m", "created": 1700000001, "context_length": None, "owned_by": "peer-b"},
            _Attrs("x:latest", 5, 2048),
        ]
    )
    assert body == {
        "object": "list",
        "data": [
            {
                "id": "smollm2:latest",
                "object": "model",
                "created": 1700000000,
                "owned_by": "llmman",
                "context_length": 8192,
                "max_model_len": 8192,
            },
            {"id": "gemma3:270m", "object": "model", "created": 1700000001, "owned_by": "peer-b"},
            {
                "id": "x:latest",
                "object": "model",
                "created": 5,
                "owned_by": "llmman",
                "context_length": 2048,
                "max_model_len": 2048,
            },
        ],
    }


def test_models_list_empty_is_an_empty_list() -> None:
    assert models_list([]) == {"object": "list", "data": []}


def test_openai_sdk_parses_our_shapes() -> None:
    model = openai.types.Model.model_validate(models_list([ModelEntry("m", 1, 4096)])["data"][0])  # type: ignore[index]
    assert model.id == "m" and model.owned_by == "llmman"
    error = ErrorObject.model_validate(openai_error("nope", status=404, code="model_not_found")["error"])
    assert error.code == "model_not_found" and error.type == "not_found_error" and error.message == "nope"
