"""The bounds of llmman.protocol.limits as pure functions: what real agents send passes, what crashes or
hogs llama-server does not (issue 13 item 1). The real-daemon proof is tests/faults/test_input_limits.py."""

from __future__ import annotations

from typing import Any

import pytest

from llmman.protocol.limits import (
    MAX_BODY_DEPTH,
    MAX_GRAMMAR_DEPTH,
    MAX_GRAMMAR_REPEAT,
    MAX_SCHEMA_DEPTH,
    MAX_STOPS,
    MAX_TOOLS,
    InputLimit,
    check_grammar,
    check_request,
    depth,
)


def _agent_tool(i: int) -> dict[str, Any]:
    """A tool as coding agents send them: nested objects and arrays, enums, descriptions, ~2 KiB."""
    edit = {"type": "object", "properties": {
        "old_string": {"type": "string", "description": "text to replace " * 10},
        "new_string": {"type": "string"},
        "options": {"type": "object", "properties": {"replace_all": {"type": "boolean"}, "ranges": {
            "type": "array", "items": {"type": "object", "properties": {
                "start": {"type": "integer"}, "end": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}}}}}}},
        "required": ["old_string", "new_string"]}
    return {"type": "function", "function": {"name": f"tool_{i}", "description": "Edits a file. " * 40,
                                              "parameters": {"type": "object", "properties": {
                                                  "path": {"type": "string"}, "edits": {
                                                      "type": "array", "items": edit}}}}}


def test_a_large_agent_tool_list_passes() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [_agent_tool(i) for i in range(300)], "stop": ["\n\n"] * 16}
    check_request(body)


def test_grammars_real_tools_generate_pass() -> None:
    json_grammar = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws  # a comment (((
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws
ws     ::= | " " | "\n" [ \t]{0,20}
'''
    check_grammar(json_grammar)
    check_grammar('root ::= "((((((((((((((((((((" [(((((((]')  # parentheses in literals and classes


@pytest.mark.parametrize(("grammar", "where"), [
    ("root ::= " + "(" * (MAX_GRAMMAR_DEPTH + 1) + '"a"' + ")" * (MAX_GRAMMAR_DEPTH + 1), "nested"),
    (f'root ::= "a"{{0,{MAX_GRAMMAR_REPEAT + 1}}}', "repetition"),
    (f'root ::= "a"{{{MAX_GRAMMAR_REPEAT + 1}}}', "repetition"),
    ('root ::= "' + "a" * (1 << 20) + '"', "longer"),
])
def test_grammars_past_the_bounds_are_refused(grammar: str, where: str) -> None:
    with pytest.raises(InputLimit, match=where) as caught:
        check_grammar(grammar)
    assert caught.value.status == 400 and caught.value.param == "grammar"


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"schema": _nested(MAX_SCHEMA_DEPTH // 2 + 1)}}},
     "response_format.json_schema"),
    ({"json_schema": _nested(MAX_SCHEMA_DEPTH // 2 + 1)}, "json_schema"),
    ({"text": {"format": {"type": "json_schema", "schema": _nested(MAX_SCHEMA_DEPTH // 2 + 1)}}},
     "text.format.schema"),
    ({"tools": [{"name": "f", "input_schema": _nested(MAX_SCHEMA_DEPTH // 2 + 1)}]}, "tools[0].input_schema"),
    ({"tools": [{"type": "function", "name": "f", "parameters": _nested(40)}]}, "tools[0].parameters"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(MAX_TOOLS + 1)]}, "tools"),
    ({"stop": ["s"] * (MAX_STOPS + 1)}, "stop"),
    ({"stop_sequences": ["x" * (65 << 10)]}, "stop_sequences[0]"),
    ({"x": [[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]] * 1, "y": _nested(MAX_BODY_DEPTH)}, "body"),
])
def test_request_fields_past_the_bounds_are_refused(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InputLimit) as caught:
        check_request({"model": "m", **body})
    assert caught.value.param == param, caught.value.message


def test_depth_is_iterative_and_stops_early() -> None:
    value: Any = 1
    for _ in range(100_000):  # far past Python's recursion limit
        value = [value]
    assert depth(value, 10) == 11
    assert depth({"a": [1, {"b": []}]}, 10) == 4
    assert depth("scalar", 10) == 0
