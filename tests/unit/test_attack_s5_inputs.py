"""Hostile values found by attacking the session's new routes, load options and Modelfiles (helper H9):
a thread count that kills llama-server while it loads, ``/detokenize`` ids outside the vocabulary (a 500
from the child's C++ range check) and a rerank ``top_n`` that llama-server's 32-bit int wraps or cannot
resize to, all the client's mistakes refused with a 400 before any child runs; a ``PARAMETER`` number too
long for Python's int() (a traceback from ``llmman create`` and the REPL's ``/set parameter``); ``FROM`` a
local file that is not a GGUF (its bytes were uploaded to the daemon's store before the daemon refused it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmman.cli.modelfile import create_body, parameter_value, parse_modelfile
from llmman.errors import BadRequest
from llmman.gguf.types import ArraySummary
from llmman.protocol.errors import Dialect, dialect_of, error_frame, stream_dialect
from llmman.protocol.llama_routes import TOP_N_MAX, detokenize_error, top_n_error
from llmman.protocol.ollama.fields import MAX_THREADS, runner_options

VOCAB = {"tokenizer.ggml.tokens": ArraySummary(type=8, count=49152)}


@pytest.mark.parametrize("threads", [MAX_THREADS + 1, 100_000, 2**62])
def test_num_thread_past_ggml_max_is_refused(threads: int) -> None:
    with pytest.raises(BadRequest, match=f'option "num_thread" must be at most {MAX_THREADS}, got {threads}'):
        runner_options({"num_thread": threads})


def test_num_thread_up_to_ggml_max_is_kept() -> None:
    assert runner_options({"num_thread": MAX_THREADS}).num_thread == MAX_THREADS
    assert runner_options({"num_thread": 0}).num_thread is None  # automatic, as before


@pytest.mark.parametrize("tokens", [[49152], [-1], [1, 2, 10**12], [1.0, 49152.5], [-0.5]])
def test_detokenize_ids_outside_the_vocabulary(tokens: list[object]) -> None:
    message = detokenize_error(tokens, VOCAB)
    assert message is not None and "ids 0 to 49151" in message


@pytest.mark.parametrize("tokens", [[], [0, 49151], [1.5], "abc", None, [True], [[1, "piece"]]])
def test_detokenize_leaves_the_rest_to_llama_server(tokens: object) -> None:
    assert detokenize_error(tokens, VOCAB) is None


def test_detokenize_without_a_known_vocabulary_checks_nothing() -> None:
    assert detokenize_error([10**12], {}) is None
    assert detokenize_error([3], {"tokenizer.ggml.tokens": ["a", "b", "c"]}) is not None


@pytest.mark.parametrize("text", ["9" * 5000, "-" + "1" * 100_000, "1e999", "-1e999", "9" * 400 + ".5"])
def test_a_parameter_number_too_long_or_large_stays_text(text: str) -> None:
    assert parameter_value(text) == text  # the daemon's type check names it; no ValueError, no inf


def test_a_parameter_number_of_normal_length_is_a_number() -> None:
    assert parameter_value("9" * 40) == int("9" * 40)  # the daemon says it is out of range
    assert parameter_value("0.5") == 0.5 and parameter_value("true") is True


def test_a_modelfile_with_a_huge_number_parses() -> None:
    request = create_body(parse_modelfile("FROM x\nPARAMETER num_ctx " + "9" * 5000 + "\n"), Path("."))
    assert request.body["parameters"] == {"num_ctx": "9" * 5000}


@pytest.mark.parametrize("content", [b"root:$6$secret:19000:0:99999:7:::\n", b"", b"GGU"])
def test_from_a_file_that_is_not_gguf_is_refused_before_upload(tmp_path: Path, content: bytes) -> None:
    secret = tmp_path / "shadow"
    secret.write_bytes(content)
    with pytest.raises(BadRequest, match="shadow: not a GGUF file"):
        create_body(parse_modelfile(f"FROM {secret}\n"), tmp_path)


def test_from_a_folder_with_a_gguf_name_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "b.gguf").write_text("secret notes")
    with pytest.raises(BadRequest, match=r"b\.gguf: not a GGUF file"):
        create_body(parse_modelfile("FROM .\n"), tmp_path)


@pytest.mark.parametrize("top_n", [-1, -0.5, TOP_N_MAX + 1, 2**40, 1e300])
def test_rerank_top_n_llama_server_cannot_hold_is_refused(top_n: float) -> None:
    assert top_n_error(top_n) == f"top_n must be between 0 and {TOP_N_MAX}, got {top_n}"


@pytest.mark.parametrize("top_n", [0, 1, 5, TOP_N_MAX, 1.5, None, "2", True])
def test_rerank_top_n_llama_server_reads_is_left_alone(top_n: object) -> None:
    assert top_n_error(top_n) is None


def test_an_infill_stream_ends_with_an_sse_error_event() -> None:
    """``/infill`` streams llama-server's SSE: its late error is a ``data:`` event, not an NDJSON line
    (which an SSE client skips, seeing the stream just stop); its errors before the first byte keep
    Ollama's shape."""
    assert dialect_of("/infill") is Dialect.OLLAMA
    assert stream_dialect("/infill") is Dialect.OPENAI
    assert error_frame(stream_dialect("/infill"), "child died", 502).startswith(b"data: {")
    assert stream_dialect("/api/generate") is Dialect.OLLAMA
    assert stream_dialect("/v1/messages") is Dialect.ANTHROPIC
