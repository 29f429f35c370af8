"""Table tests of the Codex clean-ups (protocol/responses.py)."""

from __future__ import annotations

import orjson
import pytest

from llmman.errors import BadRequest
from llmman.protocol.openai.responses import clean_request


def test_codex_body_cleaned() -> None:
    body, model = clean_request(orjson.dumps({
        "model": "m", "instructions": "Base.", "stream": True,
        "tools": [{"type": "web_search"}, {"type": "function", "name": "shell", "parameters": {}},
                  {"type": "namespace", "name": "x"}, "junk"],
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "Dev "}, {"type": "input_text",
                                                                                     "text": "rules."}]},
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "Sys."},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
    }))
    assert model == "m" and body["stream"] is True
    assert body["tools"] == [{"type": "function", "name": "shell", "parameters": {}}]
    assert body["instructions"] == "Base.\n\nDev rules.\n\nSys."
    assert body["input"] == [{"role": "user", "content": "hi"},
                             {"type": "function_call_output", "call_id": "c1", "output": "ok"}]


def test_only_non_function_tools_drops_tools_and_choice() -> None:
    raw = b'{"model":"m","input":"hi","tools":[{"type":"web_search"}],"tool_choice":"auto"}'
    body, _ = clean_request(raw)
    assert body == {"model": "m", "input": "hi"}


@pytest.mark.parametrize("raw", [b"", b"[]", b'{"input":"x"}', b'{"model":"m","tools":{}}',
                                 b'{"model":"m","input":5}', b'{"model":"m","instructions":[1]}', b"\xff"])
def test_rejects(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        clean_request(raw)
