"""llama-server's native ``/infill`` chunks as Ollama ``/api/generate`` objects
(protocol/ollama/infill.py)."""

from __future__ import annotations

import pytest

from llmman.errors import RunnerError
from llmman.protocol.ollama.infill import InfillStream, completion_chunk

NOW = "2026-01-01T00:00:00Z"
LAST = {"index": 0, "content": "", "stop": True, "stop_type": "limit", "tokens_evaluated": 14,
        "tokens_predicted": 4, "timings": {"prompt_n": 14, "prompt_ms": 2.0, "predicted_n": 4,
                                           "predicted_ms": 8.0}}


def test_completion_chunk() -> None:
    assert completion_chunk({"content": "ab", "stop": False}) == {"choices": [{"index": 0, "text": "ab"}]}
    last = completion_chunk(LAST)
    assert last["choices"] == [{"index": 0, "text": "", "finish_reason": "length"}]
    assert last["usage"] == {"prompt_tokens": 14, "completion_tokens": 4, "total_tokens": 18}
    assert completion_chunk({**LAST, "stop_type": "eos"})["choices"] == [
        {"index": 0, "text": "", "finish_reason": "stop"}]


def test_infill_stream_has_ollamas_generate_shape() -> None:
    stream = InfillStream("generate", "m", lambda: NOW)
    assert stream.feed({"content": "ret", "stop": False}) == [
        {"model": "m", "created_at": NOW, "response": "ret", "done": False}]
    assert stream.feed(LAST) == []
    final = stream.final(total_duration_ns=100, load_duration_ns=0)
    assert final["done_reason"] == "length" and final["prompt_eval_count"] == 14 and final["eval_count"] == 4
    assert final["eval_duration"] == 8_000_000 and stream.aggregate()["response"] == "ret"


def test_infill_error_chunk() -> None:
    with pytest.raises(RunnerError, match="boom"):
        InfillStream("generate", "m", lambda: NOW).feed({"error": {"code": 500, "message": "boom"}})
