"""Table tests of the Ollama embeddings translation (protocol/embeddings.py)."""

from __future__ import annotations

import base64
import math
import struct

import pytest

from llmman.errors import BadRequest, LlmmanError
from llmman.protocol.ollama.embeddings import (
    TOO_LONG,
    embed_request,
    fit_tokens,
    legacy_request,
    shorten_answer,
    too_long,
    vectors,
)

ANSWER = {"model": "x", "object": "list", "usage": {"prompt_tokens": 3, "total_tokens": 3},
          "data": [{"embedding": [0.0, 0.6, 0.8], "index": 1, "object": "embedding"},
                   {"embedding": [0.6, 0.8, 0.0], "index": 0, "object": "embedding"}]}


def test_parse_and_upstream() -> None:
    req = embed_request({"model": "m", "input": ["a", "b"], "dimensions": 2, "truncate": False})
    assert req.inputs == ["a", "b"] and req.dimensions == 2
    assert req.upstream() == {"model": "m", "input": ["a", "b"], "encoding_format": "float"}
    assert embed_request({"model": "m", "input": "a"}).inputs == ["a"]
    assert embed_request({"model": "m"}).inputs == []
    assert legacy_request({"model": "m", "prompt": ""}).inputs == []


BAD = [{}, {"model": 1}, {"model": "m", "input": 3}, {"model": "m", "input": ["a", 1]},
       {"model": "m", "dimensions": 0}, {"model": "m", "dimensions": True}, {"model": "m", "truncate": "no"}]


@pytest.mark.parametrize("body", BAD)
def test_rejects(body: dict[str, object]) -> None:
    with pytest.raises(BadRequest):
        embed_request(body)


def test_vectors_ordered_and_cut() -> None:
    vecs, tokens = vectors(ANSWER)
    assert vecs == [[0.6, 0.8, 0.0], [0.0, 0.6, 0.8]] and tokens == 3
    cut, _ = vectors(ANSWER, dimensions=1)
    assert cut == [[1.0], [0.0]]  # renormalised; a zero head stays zero
    assert math.isclose(sum(v * v for v in cut[0]), 1.0)
    with pytest.raises(LlmmanError):
        vectors({"data": [{"embedding": "base64"}]})


@pytest.mark.parametrize("dims", [0, -1, -8, 1.5, "8", True, [4]])
def test_embed_dimensions_must_be_a_positive_integer(dims: object) -> None:
    with pytest.raises(BadRequest, match="dimensions must be a positive integer"):
        embed_request({"model": "m", "input": "x", "dimensions": dims})


def _b64(values: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def test_shorten_openai_answer_float_and_base64() -> None:
    cut = shorten_answer(ANSWER, 2)
    assert isinstance(cut, dict)
    assert [row["embedding"] for row in cut["data"]] == [[0.0, 1.0], [0.6, 0.8]]
    assert cut["usage"] == ANSWER["usage"] and cut["model"] == "x"
    assert shorten_answer(ANSWER, 10) == ANSWER  # rows already short enough stay as they are
    encoded = {"data": [{"embedding": _b64([0.0, 3.0, 4.0]), "index": 0}]}
    row = shorten_answer(encoded, 2)["data"][0]  # type: ignore[index]
    assert struct.unpack("<2f", base64.b64decode(row["embedding"])) == (0.0, 1.0)
    assert shorten_answer({"data": [{"embedding": "%%%"}]}, 2) == {"data": [{"embedding": "%%%"}]}
    assert shorten_answer({"error": "x"}, 2) == {"error": "x"}


def test_truncate_and_num_ctx_parsed() -> None:
    """``truncate`` defaults to true (Ollama); ``options.num_ctx`` sizes the embedding child."""
    assert embed_request({"model": "m", "input": "a"}).truncate is True
    assert embed_request({"model": "m", "input": "a", "truncate": None}).truncate is True
    assert embed_request({"model": "m", "input": "a", "truncate": False}).truncate is False
    assert embed_request({"model": "m", "input": "a", "options": {"num_ctx": 300}}).num_ctx == 300
    assert embed_request({"model": "m", "input": "a"}).num_ctx is None
    assert legacy_request({"model": "m", "prompt": "a", "options": {"num_ctx": 64}}).num_ctx == 64
    with pytest.raises(BadRequest):
        embed_request({"model": "m", "input": "a", "options": {"num_ctx": "big"}})


def test_fit_tokens_cuts_or_refuses() -> None:
    inputs = [[1, 2, 3, 4, 5], [7, 8], []]
    assert fit_tokens(inputs, 3, truncate=True) == [[1, 2, 3], [7, 8], []]
    assert fit_tokens(inputs, 5, truncate=False) == inputs  # exactly the context fits
    with pytest.raises(BadRequest) as info:
        fit_tokens(inputs, 4, truncate=False)
    assert info.value.message == TOO_LONG == "the input length exceeds the context length"


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (500, "input (601 tokens) is too large to process. increase the physical batch size", True),
        (400, "request (5001 tokens) exceeds the available context size (4096 tokens), try increasing", True),
        (400, "Input content cannot be empty", False),
        (500, "Context size has been exceeded.", False),
        (200, "too large to process", False),
    ],
)
def test_too_long(status: int, message: str, expected: bool) -> None:
    assert too_long(status, message) is expected
