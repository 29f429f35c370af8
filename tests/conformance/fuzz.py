"""Hypothesis strategies for bad request bodies, shared by every route's fuzz test (the conformance suite
against the real model, and tests/unit/test_api_fidelity.py against the in-process app).

- :func:`bodies`: raw bytes (invalid UTF-8 included), arbitrary JSON, objects with the given fields of any
  type.
- :func:`openai_chat_bodies`, :func:`anthropic_bodies`, :func:`embedding_bodies`: a valid request with one
  to three of its fields replaced by a malformed shape (a message without ``role``, a content block
  without ``text``, a tool without ``function``/``input_schema``, ``stop_sequences`` as a string, a
  negative ``dimensions``, huge numbers, wrong types). Every body keeps a small ``max_tokens`` (or none
  that validates), so a body that happens to be valid only costs a couple of generated tokens.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
json_values = st.recursive(
    _scalars,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
    max_leaves=8,
)
HUGE = st.sampled_from([2**31, 2**63, 2**70, -(2**63), 1e308, -1e308])
WRONG = st.sampled_from([None, True, False, 0, -1, 1.5, "", "x", [], [1], {}, {"a": 1}]) | HUGE


def _dumps(value: object) -> bytes:
    return json.dumps(value).encode()  # stdlib: huge integers included


def bodies(*fields: str) -> st.SearchStrategy[bytes]:
    """Raw bytes (invalid UTF-8 included), arbitrary JSON, and objects with ``fields`` of any type."""
    return st.one_of(
        st.binary(max_size=64),
        json_values.map(_dumps),
        st.fixed_dictionaries({f: json_values for f in fields}).map(_dumps),
        st.fixed_dictionaries({f: json_values for f in fields if f != "model"},
                              optional={"model": st.just("smollm2:135m")}).map(_dumps),
    )


def _mutated(base: dict[str, Any], bad: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    """``base`` with one to three of ``bad``'s fields replaced by a value of their strategy."""
    keys = st.lists(st.sampled_from(sorted(bad)), min_size=1, max_size=3, unique=True)
    changes = keys.flatmap(lambda ks: st.fixed_dictionaries({k: bad[k] for k in ks}))
    return changes.map(lambda change: _dumps({**base, **change}))


# ------------------------------------------------------------------------------------------ OpenAI
_TEXT_PART = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["text", "image_url", "nope"]) | WRONG,
    "text": st.text(max_size=4) | WRONG, "image_url": WRONG,
})
_TOOL_CALL = st.fixed_dictionaries({}, optional={
    "id": st.just("call_1") | WRONG, "type": st.just("function") | WRONG,
    "function": st.fixed_dictionaries({}, optional={"name": st.just("f") | WRONG,
                                                    "arguments": st.just("{}") | WRONG}) | WRONG})
_OPENAI_MESSAGE = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "bogus", ""]) | WRONG,
    "content": st.text(max_size=6) | st.lists(_TEXT_PART | WRONG, max_size=2) | WRONG,
    "name": WRONG, "tool_calls": st.lists(_TOOL_CALL | WRONG, max_size=2) | WRONG, "tool_call_id": WRONG,
})
_OPENAI_TOOL = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["function", "web_search"]) | WRONG,
    "function": st.fixed_dictionaries({}, optional={"name": st.sampled_from(["f", ""]) | WRONG,
                                                    "parameters": WRONG, "description": WRONG}) | WRONG,
})


def openai_chat_bodies(model: str) -> st.SearchStrategy[bytes]:
    """Near-valid ``/v1/chat/completions`` bodies with malformed ``messages``, ``tools`` and fields."""
    base = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    bad = {
        "messages": st.lists(_OPENAI_MESSAGE | WRONG, max_size=3) | WRONG,
        "tools": st.lists(_OPENAI_TOOL | WRONG, min_size=1, max_size=2) | WRONG,
        "tool_choice": st.sampled_from(["auto", "required", "bogus"]) | WRONG,
        "temperature": WRONG | st.floats(min_value=-10, max_value=10), "top_p": WRONG,
        "max_tokens": st.sampled_from([-5, 0, "2", 2.5, True, [1], {}, 2**40, 2**70]),
        "stream": WRONG, "stop": WRONG | st.lists(WRONG, max_size=2), "n": WRONG,
        "stream_options": WRONG, "response_format": WRONG | st.fixed_dictionaries({"type": WRONG}),
        "seed": WRONG, "logprobs": WRONG, "top_logprobs": WRONG, "reasoning_effort": WRONG,
    }
    return _mutated(base, bad)


# ------------------------------------------------------------------------------------------ Anthropic
_SOURCE = st.fixed_dictionaries({}, optional={"type": st.sampled_from(["base64", "url", "file"]) | WRONG,
                                              "media_type": WRONG, "data": WRONG, "url": WRONG})
_BLOCK = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking", "document", "bogus"])
    | WRONG,
    "text": st.text(max_size=4) | WRONG, "source": _SOURCE | WRONG, "id": WRONG, "name": WRONG,
    "input": WRONG, "tool_use_id": st.just("toolu_1") | WRONG, "content": WRONG, "thinking": WRONG,
    "signature": WRONG, "is_error": WRONG,
})
_ANTHROPIC_MESSAGE = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["user", "assistant", "system", "tool", ""]) | WRONG,
    "content": st.text(max_size=6) | st.lists(_BLOCK | WRONG, max_size=2) | WRONG,
})
_ANTHROPIC_TOOL = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["get_weather", "bad name", ""]) | WRONG, "input_schema": WRONG,
    "description": WRONG, "type": st.sampled_from(["custom", "web_search_20250305"]) | WRONG,
})


def anthropic_bodies(model: str) -> st.SearchStrategy[bytes]:
    """Near-valid ``/v1/messages`` bodies with malformed blocks, ``system``, ``tools``, ``tool_choice``,
    ``stop_sequences``, ``thinking`` and wrong-typed fields."""
    base = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    bad = {
        "messages": st.lists(_ANTHROPIC_MESSAGE | WRONG, max_size=3) | WRONG,
        "system": WRONG | st.lists(_BLOCK | WRONG, max_size=2),
        "tools": st.lists(_ANTHROPIC_TOOL | WRONG, min_size=1, max_size=2) | WRONG,
        "tool_choice": WRONG | st.fixed_dictionaries({}, optional={
            "type": st.sampled_from(["auto", "any", "tool", "none", "bogus"]) | WRONG, "name": WRONG}),
        "stop_sequences": WRONG | st.lists(WRONG, max_size=2),
        "max_tokens": st.sampled_from([None, -5, 0, "2", 2.5, True, [1], {}, 2**31, 2**70]),
        "thinking": st.fixed_dictionaries({}, optional={
            "type": st.sampled_from(["enabled", "disabled", "adaptive", "on"]) | WRONG,
            "budget_tokens": WRONG | st.integers(min_value=-5, max_value=5000)}) | WRONG,
        "temperature": WRONG | st.floats(min_value=-3, max_value=3), "top_p": WRONG, "top_k": WRONG,
        "stream": WRONG, "metadata": WRONG,
    }
    return _mutated(base, bad)


# ------------------------------------------------------------------------------------------ embeddings
DIMENSIONS = st.sampled_from([0, -1, -8, -(2**40), 2**70, 1.5, "8", True, [8], {}])


def embedding_bodies(model: str) -> st.SearchStrategy[bytes]:
    """Near-valid ``/api/embed`` and ``/v1/embeddings`` bodies: bad ``dimensions`` (zero, negative, huge,
    wrong types), ``input``, ``encoding_format`` and ``truncate``."""
    base = {"model": model, "input": "hello", "dimensions": 4}
    bad = {
        "dimensions": DIMENSIONS | WRONG,
        "input": WRONG | st.lists(WRONG, max_size=2),
        "encoding_format": st.sampled_from(["float", "base64", "bogus"]) | WRONG,
        "truncate": WRONG,
    }
    return _mutated(base, bad)
