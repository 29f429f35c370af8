"""Fault catalogue: input llama-server cannot survive (issue 13 item 1, the validation part), against a real
``llmman serve`` with the real llama-server and SmolLM2.

Before: a ``grammar`` of 100 000 nested parentheses went to llama-server, which segfaulted (20 000 are
enough on this build; 10 000 survive), cutting every stream of the model. Now every dialect refuses input
past the bounds of :mod:`llmman.protocol.limits` with a 400 in its own shape, before the child sees it: the
child's pid is the same afterwards and a normal request is still served.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmman.protocol.limits import MAX_GRAMMAR_DEPTH, MAX_SCHEMA_DEPTH, MAX_STOPS, MAX_TOOLS
from tests.integration.daemons import Daemon, model_daemon

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(300)]

MODEL = "smollm2:135m"
DEADLY_GRAMMAR = "root ::= " + "(" * 100_000 + '"a"' + ")" * 100_000


def _model_file() -> Path:
    path = Path(os.environ.get("LLMMAN_TEST_MODEL")
                or Path.home() / ".cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail("CI must have the real model: run scripts/setup.sh --model")
        pytest.skip("real model missing: run scripts/setup.sh --model")
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with model_daemon(tmp_path_factory.mktemp("limits"), _model_file(), MODEL) as d:
        yield d


def _nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


MSGS = [{"role": "user", "content": "Say a"}]
TOO_DEEP = _nested_schema(MAX_SCHEMA_DEPTH // 2 + 1)  # each level is two JSON levels (properties, a)
MANY_TOOLS = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
              for i in range(MAX_TOOLS + 1)]
STOPS = [f"s{i}" for i in range(MAX_STOPS + 1)]

# (path, body, param named in the refusal); one per dialect and bounded field.
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2, "grammar": DEADLY_GRAMMAR},
     "grammar"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSGS, "max_tokens": 2, "grammar": DEADLY_GRAMMAR},
     "grammar"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSGS, "max_tokens": 2, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": TOO_DEEP}}},
     "response_format.json_schema"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSGS, "max_tokens": 2, "tools": MANY_TOOLS},
     "tools"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2, "stop": STOPS}, "stop"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2, "json_schema": TOO_DEEP},
     "json_schema"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": MSGS, "grammar": DEADLY_GRAMMAR},
     "grammar"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": MSGS, "tools": [
        {"name": "f", "input_schema": TOO_DEEP}]}, "tools[0].input_schema"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": MSGS, "stop_sequences": STOPS},
     "stop_sequences"),
    ("/v1/responses", {"model": MODEL, "input": "a", "max_output_tokens": 2, "grammar": DEADLY_GRAMMAR},
     "grammar"),
    ("/v1/responses", {"model": MODEL, "input": "a", "text": {"format": {
        "type": "json_schema", "name": "s", "schema": TOO_DEEP}}}, "text.format.schema"),
    ("/api/chat", {"model": MODEL, "messages": MSGS, "stream": False, "format": TOO_DEEP}, "format"),
    ("/api/generate", {"model": MODEL, "prompt": "a", "stream": False, "format": TOO_DEEP}, "format"),
    ("/api/generate", {"model": MODEL, "prompt": "a", "stream": False, "options": {"stop": STOPS}},
     "options.stop"),
    ("/api/chat", {"model": MODEL, "messages": MSGS, "stream": False, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": TOO_DEEP}}]},
     "tools[0].function.parameters"),
    ("/api/chat", {"model": MODEL, "messages": MSGS, "stream": False, "x": _deep(300)}, "body"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSGS, "x": _deep(300)}, "body"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": MSGS, "x": _deep(300)}, "body"),
    ("/v1/responses", {"model": MODEL, "input": "a", "x": _deep(300)}, "body"),
]


def _child_pids(d: Daemon) -> list[int]:
    return sorted(p.pid for p in d.children())


def _assert_dialect(path: str, answer: httpx.Response, param: str) -> None:
    assert answer.status_code == 400, answer.text
    err = answer.json()
    if path.startswith("/v1/messages"):
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
        assert err["error"]["message"].startswith(param), err
    elif path.startswith("/v1/"):
        assert err["error"]["type"] == "invalid_request_error" and param in err["error"]["message"], err
    else:
        assert isinstance(err["error"], str) and err["error"].startswith(param), err


def test_deadly_grammar_is_refused_and_the_child_lives(daemon: Daemon) -> None:
    with daemon.client() as client:
        warm = client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 2})
        assert warm.status_code == 200, warm.text
        pids = _child_pids(daemon)
        assert len(pids) == 1
        fine = "root ::= " + "(" * MAX_GRAMMAR_DEPTH + '"a"' + ")" * MAX_GRAMMAR_DEPTH  # at the bound: served
        ok = client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 2,
                                                  "grammar": fine})
        assert ok.status_code == 200, ok.text
        refused = client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 2,
                                                       "grammar": DEADLY_GRAMMAR})
        _assert_dialect("/v1/completions", refused, "grammar")
        after = client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 2})
        assert after.status_code == 200, after.text
        assert _child_pids(daemon) == pids, daemon.log_text()[-3000:]


@pytest.mark.parametrize(("path", "body", "param"), REFUSED, ids=[f"{p}:{q}" for p, _, q in REFUSED])
def test_every_dialect_refuses_input_past_the_bounds(daemon: Daemon, path: str, body: dict[str, Any],
                                                     param: str) -> None:
    before = _child_pids(daemon)
    with daemon.client() as client:
        answer = client.post(path, json=body)
    _assert_dialect(path, answer, param)
    assert _child_pids(daemon) == before  # nothing was started, nothing crashed
