"""Token counts read from an answer's bytes in every dialect (llmman.protocol.usage)."""

from __future__ import annotations

import pytest

from llmman.protocol.usage import HEAD_BYTES, TAIL_BYTES, AnswerSample, error_of, speed_of, usage_of


def sample(*chunks: bytes) -> AnswerSample:
    s = AnswerSample()
    for chunk in chunks:
        s.feed(chunk)
    return s


@pytest.mark.parametrize(("answer", "expected"), [
    (b'{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}', (7, 3)),
    (b'{"model":"m","done":true,"prompt_eval_count":12,"eval_count":5}\n', (12, 5)),
    (b'{"type":"message","usage":{"input_tokens":9,"output_tokens":4}}', (9, 4)),
    (b'{"object":"list","data":[],"usage":{"prompt_tokens":6,"total_tokens":6}}', (6, None)),
    (b'{"error":"model not found"}', (None, None)),
])
def test_each_dialect_usage(answer: bytes, expected: tuple[int | None, int | None]) -> None:
    assert usage_of(sample(answer)) == expected


def test_an_anthropic_stream_input_tokens_come_first_and_output_last_past_a_long_middle() -> None:
    start = b'event: message_start\ndata: {"message":{"usage":{"input_tokens":21,"output_tokens":1}}}\n\n'
    middle = b'event: content_block_delta\ndata: {"delta":{"text":"word "}}\n\n' * 2000
    end = b'event: message_delta\ndata: {"usage":{"output_tokens":40}}\n\n'
    s = sample(start, middle, end)
    assert s.size > HEAD_BYTES + TAIL_BYTES
    assert usage_of(s) == (21, 40)


def test_the_last_figure_wins_and_prompt_eval_count_is_not_eval_count() -> None:
    assert usage_of(sample(b'{"prompt_eval_count":3}', b'{"eval_count":1}', b'{"eval_count":2}')) == (3, 2)
    assert usage_of(sample(b'{"prompt_eval_count":3}')) == (3, None)


def test_error_messages_of_every_dialect() -> None:
    assert error_of(sample(b'{"error":"model \\"x\\" not found"}')) == 'model \\"x\\" not found'
    assert error_of(sample(b'{"error":{"message":"busy","type":"server_error"}}')) == "busy"
    anthropic = b'{"type":"error","error":{"type":"overloaded_error","message":"later"}}'
    assert error_of(sample(anthropic)) == "later"
    assert error_of(sample(b'{"message":{"role":"assistant","content":"hi"}}')) == ""


def test_the_speed_an_answer_reports() -> None:
    openai = b'{"usage":{"completion_tokens":40},"timings":{"predicted_n":40,"predicted_per_second":12.5}}'
    assert speed_of(sample(openai)) == 12.5
    ollama = b'{"done":true,"eval_count":50,"eval_duration":2000000000}'
    assert speed_of(sample(ollama)) == 25.0
    assert speed_of(sample(b'{"usage":{"completion_tokens":3}}')) is None
    assert speed_of(sample(b'{"eval_count":5,"eval_duration":0}')) is None
