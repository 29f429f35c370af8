"""Ollama's rules for prompts longer than the context (protocol/ollama/truncate.py), and the request fields
that carry them (``truncate``; ``suffix`` to ``/infill``)."""

from __future__ import annotations

import orjson
import pytest

from llmman.errors import BadRequest
from llmman.protocol.ollama.request import CHAT_PATH, INFILL_PATH, chat_request, generate_request
from llmman.protocol.ollama.truncate import (
    MAX_CHARS_PER_TOKEN,
    Overflow,
    block_start,
    cut_order,
    first_plausible,
    keep_head_and_tail,
    kept,
    message_text,
    overflow,
    pre_cut,
    prompt_target,
    starts,
    with_text,
)

REFUSED = orjson.dumps({"error": {
    "code": 400, "message": "request (731 tokens) exceeds the available context size (512 tokens)",
    "type": "exceed_context_size_error", "n_prompt_tokens": 731, "n_ctx": 512}})


def test_overflow_reads_llama_servers_refusal() -> None:
    assert overflow(400, REFUSED) == Overflow(731, 512)
    assert overflow(500, REFUSED) is None
    assert overflow(400, b'{"error": {"type": "invalid_request_error", "message": "x"}}') is None
    assert overflow(400, b"not json") is None
    assert overflow(400, b'{"error": {"type": "exceed_context_size_error"}}') is None


@pytest.mark.parametrize(("n_ctx", "keep", "target"), [(512, 4, 258), (4096, 4, 2050), (2, 4, 1), (1, 4, 0),
                                                        (512, 0, 256), (512, 600, 511)])
def test_prompt_target_is_ollamas_runner_limit(n_ctx: int, keep: int, target: int) -> None:
    assert prompt_target(n_ctx, keep) == target


SYS = {"role": "system", "content": "s"}
CALL = {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}
CHAT = [SYS, {"role": "user", "content": "u0"}, CALL, {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"}, {"role": "assistant", "content": "a"},
        {"role": "system", "content": "s2"}, {"role": "user", "content": "u1"}]


def test_a_tool_result_is_never_kept_without_its_call() -> None:
    assert [block_start(CHAT, i) for i in range(len(CHAT))] == [0, 1, 2, 2, 2, 5, 6, 7]
    assert starts(CHAT) == [0, 1, 2, 5, 6, 7]
    orphan = [{"role": "user", "content": "u"}, {"role": "tool", "content": "r"}]
    assert block_start(orphan, 1) == 1  # no assistant call before it: kept as it is


def test_kept_holds_the_system_messages_and_the_latest_turns() -> None:
    assert kept(CHAT, 5) == [SYS, CHAT[5], CHAT[6], CHAT[7]]
    assert kept(CHAT, 7) == [SYS, CHAT[6], CHAT[7]]
    assert kept(CHAT, 0) == CHAT


def test_text_is_cut_from_the_other_messages_first_then_the_system_ones() -> None:
    assert cut_order([SYS, {"role": "user"}, {"role": "system"}, {"role": "user"}]) == [1, 3, 0, 2]


def test_text_of_a_message_and_its_replacement() -> None:
    image = {"type": "image_url", "image_url": {}}
    text = {"type": "text", "text": "ab"}
    parts = {"role": "user", "content": [text, image, {"type": "text", "text": "cd"}]}
    assert message_text(parts) == "abcd"
    assert with_text(parts, "d")["content"] == [{"type": "text", "text": "d"},
                                                {"type": "image_url", "image_url": {}}]
    assert with_text({"role": "user", "content": "long"}, "ng") == {"role": "user", "content": "ng"}
    assert message_text({"role": "assistant", "content": None}) == ""


def test_keep_head_and_tail_as_ollamas_runner() -> None:
    tokens = list(range(20))
    assert keep_head_and_tail(tokens, 8, 3) == [0, 1, 2, 15, 16, 17, 18, 19]
    assert keep_head_and_tail(tokens, 25, 3) == tokens
    assert keep_head_and_tail(tokens, 4, 9) == [0, 1, 2, 3]


def test_truncate_is_read_on_chat_and_generate() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert chat_request(body).truncate is True
    assert chat_request({**body, "truncate": False}).truncate is False
    assert generate_request({"model": "m", "prompt": "p", "truncate": False}).truncate is False
    with pytest.raises(BadRequest, match="truncate must be a boolean"):
        chat_request({**body, "truncate": "no"})


def test_suffix_is_fill_in_the_middle() -> None:
    req = generate_request({"model": "m", "prompt": "def f():", "suffix": "\n", "stream": False,
                            "options": {"num_predict": 5, "temperature": 0}, "logprobs": True})
    assert req.path == INFILL_PATH and req.kind == "generate" and req.stream is False
    assert req.body["input_prefix"] == "def f():" and req.body["input_suffix"] == "\n"
    assert req.body["max_tokens"] == 5 and req.body["temperature"] == 0 and req.body["stream"] is True
    assert "messages" not in req.body and "logprobs" not in req.body
    raw = generate_request({"model": "m", "prompt": "p", "suffix": "s", "raw": True})
    assert raw.path != INFILL_PATH and raw.body["prompt"] == "p"  # raw: verbatim, the suffix ignored
    assert generate_request({"model": "m", "prompt": "p"}).path == CHAT_PATH
    assert generate_request({"model": "m", "suffix": "s"}).is_load  # no prompt: a load, as in Ollama


def test_the_search_skips_starts_whose_text_is_far_too_long() -> None:
    """first_plausible: with a budget of target x MAX_CHARS_PER_TOKEN characters, the starts whose kept text
    (system messages included) exceeds it are skipped; the kept text only shrinks, so it is the first
    within budget; none within: the last start."""
    target = 10
    budget = target * MAX_CHARS_PER_TOKEN
    system = {"role": "system", "content": "s" * 10}
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x" * (budget // 4)}
             for i in range(12)]
    chat = [system, *turns]
    places = starts(chat)
    index = first_plausible(chat, places, target)
    kept_text = sum(len(message_text(m)) for m in kept(chat, places[index]))
    assert kept_text <= budget
    earlier = sum(len(message_text(m)) for m in kept(chat, places[index - 1]))
    assert earlier > budget  # one start earlier is over the budget
    assert first_plausible(chat, places, 10**6) == 0  # a big target skips nothing
    huge = [system, {"role": "user", "content": "y" * (budget + 1)}]
    assert first_plausible(huge, starts(huge), target) == len(starts(huge)) - 1


def test_a_text_longer_than_the_budget_is_cut_to_its_end_before_counting() -> None:
    budget = 3 * MAX_CHARS_PER_TOKEN
    text = "a" * budget + "THE END"
    short = {"role": "system", "content": "keep me"}
    image = {"type": "image_url", "image_url": "x"}
    parts = {"role": "user", "content": [{"type": "text", "text": text}, image]}
    out = pre_cut([short, {"role": "user", "content": text}, parts], 3)
    assert out[0] is short
    assert message_text(out[1]) == text[-budget:] and message_text(out[1]).endswith("THE END")
    assert message_text(out[2]) == text[-budget:]
    content = out[2]["content"]
    assert isinstance(content, list) and image in content  # the image stays
