"""Bounds on request input, checked before anything reaches llama-server (one place; docs/security.md).

llama-server parses grammars and converts JSON schemas recursively, on its HTTP thread's stack: a
``grammar`` of 20 000 nested parentheses segfaults it (measured on this build with an 8 MiB stack; 10 000
survive), cutting every stream of the model. A schema nested 5 000 objects deep kept a slot busy for
minutes. llmman itself re-serialises bodies with orjson, which stops at 255 levels. So llmman refuses,
with a 400 in the route's dialect, input past these bounds. Each is far above what real clients send:

- :data:`MAX_BODY_DEPTH` (128): the nesting of the whole JSON body. Real bodies nest about 10 levels
  (a tool schema inside ``tools[i].function.parameters`` adds its own depth).
- :data:`MAX_SCHEMA_DEPTH` (64): the JSON nesting inside one JSON schema (``response_format``,
  ``json_schema``, Ollama ``format``, a tool's ``parameters``/``input_schema``, Responses ``text.format``);
  an object property costs two levels (``properties``, then the property's schema), so this is 32 nested
  objects. OpenAI's structured outputs allow 10; agent tool schemas stay under 10.
- :data:`MAX_SCHEMA_BYTES` (1 MiB): one schema, serialised. Claude Code's largest built-in tool schema is
  a few KiB; its whole tool list about 60 KiB, Codex's about 30 KiB.
- :data:`MAX_TOOLS` (1024) and :data:`MAX_TOOLS_BYTES` (8 MiB): the tool list. OpenAI caps it at 128;
  an agent with many MCP servers sends a few hundred tools (under 1 MiB).
- :data:`MAX_GRAMMAR_BYTES` (1 MiB), :data:`MAX_GRAMMAR_DEPTH` (256 nested groups, far under the ~10 000
  that crash an 8 MiB stack and under what a 512 KiB thread stack survives) and
  :data:`MAX_GRAMMAR_REPEAT` (10 000 in an ``{m,n}`` repetition, which llama-server expands into that
  many rules; 100 000 took seconds).
- :data:`MAX_STOPS` (1024 strings) and :data:`MAX_STOP_CHARS` (64 KiB each): every stop string is matched
  against the output at every token. OpenAI allows 4.

Every check raises :class:`InputLimit`, a :class:`~llmman.errors.BadRequest` (400) naming the field
(``param``, OpenAI's bracket form such as ``tools[3].function.parameters``). Pure functions, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import orjson

from llmman.errors import BadRequest

__all__ = [
    "MAX_BODY_DEPTH",
    "MAX_GRAMMAR_BYTES",
    "MAX_GRAMMAR_DEPTH",
    "MAX_GRAMMAR_REPEAT",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "MAX_STOPS",
    "MAX_STOP_CHARS",
    "MAX_TOOLS",
    "MAX_TOOLS_BYTES",
    "InputLimit",
    "check_body_depth",
    "check_grammar",
    "check_request",
    "check_schema",
    "check_stops",
    "check_tools",
    "depth",
]

MAX_BODY_DEPTH = 128
MAX_SCHEMA_DEPTH = 64
MAX_SCHEMA_BYTES = 1 << 20
MAX_TOOLS = 1024
MAX_TOOLS_BYTES = 8 << 20
MAX_GRAMMAR_BYTES = 1 << 20
MAX_GRAMMAR_DEPTH = 256
MAX_GRAMMAR_REPEAT = 10_000
MAX_STOPS = 1024
MAX_STOP_CHARS = 64 << 10

#: What does not count as grouping in GBNF: string literals, character classes, comments.
_GBNF_SKIP = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|#[^\n]*', re.DOTALL)
_GBNF_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


class InputLimit(BadRequest):
    """Input past one of this module's bounds (400); ``param`` names the field."""

    def __init__(self, param: str, problem: str) -> None:
        super().__init__(f"{param}: {problem}")
        self.param = param
        self.problem = problem


def depth(value: object, stop_at: int) -> int:
    """How deeply ``value`` nests (a scalar 0, ``[]`` 1, ``[[1]]`` 2), counted without recursion and
    given up past ``stop_at`` (the result is then ``stop_at + 1``)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        level += 1
        if level > deepest:
            deepest = level
            if deepest > stop_at:
                return deepest
        stack.extend((child, level) for child in children if isinstance(child, dict | list))
    return deepest


def check_body_depth(body: object) -> None:
    """The whole parsed body nests at most :data:`MAX_BODY_DEPTH` levels."""
    if depth(body, MAX_BODY_DEPTH) > MAX_BODY_DEPTH:
        raise InputLimit("body", f"JSON nested more than {MAX_BODY_DEPTH} levels deep")


def _size(value: object) -> int:
    try:
        return len(orjson.dumps(value))
    except orjson.JSONEncodeError:  # deeper than orjson writes (depth is checked first) or not JSON
        return 1 << 62


def check_schema(schema: object, param: str) -> None:
    """One JSON schema: at most :data:`MAX_SCHEMA_DEPTH` levels and :data:`MAX_SCHEMA_BYTES` serialised.
    Anything but an object or array passes (the dialect's validator judges the type)."""
    if not isinstance(schema, dict | list):
        return
    if depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise InputLimit(param, f"schema nested more than {MAX_SCHEMA_DEPTH} levels deep")
    if _size(schema) > MAX_SCHEMA_BYTES:
        raise InputLimit(param, f"schema larger than {MAX_SCHEMA_BYTES >> 20} MiB")


def check_grammar(grammar: object, param: str = "grammar") -> None:
    """A GBNF grammar string: at most :data:`MAX_GRAMMAR_BYTES`, groups ``( )`` nested at most
    :data:`MAX_GRAMMAR_DEPTH` deep, repetition counts at most :data:`MAX_GRAMMAR_REPEAT`."""
    if not isinstance(grammar, str):
        return
    if len(grammar) > MAX_GRAMMAR_BYTES:
        raise InputLimit(param, f"grammar longer than {MAX_GRAMMAR_BYTES >> 20} MiB")
    bare = _GBNF_SKIP.sub(" ", grammar)
    level = deepest = 0
    for char in re.findall(r"[()]", bare):
        level = level + 1 if char == "(" else max(0, level - 1)
        deepest = max(deepest, level)
    if deepest > MAX_GRAMMAR_DEPTH:
        raise InputLimit(param, f"grammar groups nested {deepest} deep, more than {MAX_GRAMMAR_DEPTH}")
    for match in _GBNF_REPEAT.finditer(bare):
        counts = [int(text) for text in match.groups() if text]
        if any(count > MAX_GRAMMAR_REPEAT for count in counts):
            raise InputLimit(param, f"grammar repetition {match.group(0)} over {MAX_GRAMMAR_REPEAT}")


def check_stops(stops: object, param: str = "stop") -> None:
    """A stop string or list: at most :data:`MAX_STOPS` strings of at most :data:`MAX_STOP_CHARS` each."""
    items = [stops] if isinstance(stops, str) else stops if isinstance(stops, list) else []
    if len(items) > MAX_STOPS:
        raise InputLimit(param, f"{len(items)} stop strings, more than {MAX_STOPS}")
    for i, item in enumerate(items):
        if isinstance(item, str) and len(item) > MAX_STOP_CHARS:
            raise InputLimit(f"{param}[{i}]", f"stop string longer than {MAX_STOP_CHARS} characters")


def _tool_schemas(tool: Mapping[str, object]) -> list[tuple[str, object]]:
    """A tool's schemas in every dialect: OpenAI chat's ``function.parameters``, Responses' and
    Ollama's flat ``parameters``, Anthropic's ``input_schema``."""
    out: list[tuple[str, object]] = []
    fn = tool.get("function")
    if isinstance(fn, Mapping):
        out.append(("function.parameters", fn.get("parameters")))
    out += [(key, tool.get(key)) for key in ("parameters", "input_schema")]
    return [(key, value) for key, value in out if value is not None]


def check_tools(tools: object, param: str = "tools") -> None:
    """A tool list: at most :data:`MAX_TOOLS` tools, :data:`MAX_TOOLS_BYTES` in all, each schema within
    :func:`check_schema`'s bounds."""
    if not isinstance(tools, list):
        return
    if len(tools) > MAX_TOOLS:
        raise InputLimit(param, f"{len(tools)} tools, more than {MAX_TOOLS}")
    for i, tool in enumerate(tools):
        if isinstance(tool, Mapping):
            for key, schema in _tool_schemas(tool):
                check_schema(schema, f"{param}[{i}].{key}")
    if _size(tools) > MAX_TOOLS_BYTES:
        raise InputLimit(param, f"tools larger than {MAX_TOOLS_BYTES >> 20} MiB in all")


def check_request(body: Mapping[str, object]) -> None:
    """Every bound on a parsed request body of any dialect: its depth, then ``grammar``, ``json_schema``,
    ``response_format.json_schema.schema`` (and ``.json_schema`` itself), Responses'
    ``text.format.schema``, ``tools``, ``stop`` and ``stop_sequences`` where present. Ollama's ``format``
    and ``options.stop`` are checked by its request builders.

    Raises:
        InputLimit: the first bound exceeded.
    """
    check_body_depth(body)
    check_grammar(body.get("grammar"))
    check_schema(body.get("json_schema"), "json_schema")
    fmt = body.get("response_format")
    if isinstance(fmt, Mapping):
        inner = fmt.get("json_schema")
        check_schema(inner, "response_format.json_schema")
        if isinstance(inner, Mapping):
            check_schema(inner.get("schema"), "response_format.json_schema.schema")
        check_schema(fmt.get("schema"), "response_format.schema")
    text = body.get("text")
    text_format = text.get("format") if isinstance(text, Mapping) else None
    if isinstance(text_format, Mapping):
        check_schema(text_format.get("schema"), "text.format.schema")
    check_tools(body.get("tools"))
    check_stops(body.get("stop"))
    check_stops(body.get("stop_sequences"), "stop_sequences")
