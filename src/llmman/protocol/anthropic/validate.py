"""Anthropic Messages request checks, as Anthropic's API makes them, before anything goes to llama-server.

llama-server's own ``/v1/messages`` accepts most malformed bodies with a 200 (it drops what it does not
understand: an unknown block type, a ``tool_result`` without ``tool_use_id``, a ``system`` block without
text, a ``stop_sequences`` string) or fails with a 500 (a text block without ``text``). Anthropic answers
all of these with a 400 ``invalid_request_error``, and so does llmman. Messages use Anthropic's
``<path>: <problem>`` wording, e.g. ``messages.0.content.1.text: Field required``, ``max_tokens: Field
required``, ``temperature: Input should be less than or equal to 1``.

What is checked (``/v1/messages``; ``/v1/messages/count_tokens`` takes the same body without
``max_tokens`` and the sampling fields):

- ``model`` a non-empty string; ``max_tokens`` required, an integer ≥ 1.
- ``messages`` a non-empty array of ``{role, content}``; ``role`` ``user`` or ``assistant`` (llmman also
  takes ``system``, which it moves into the top-level ``system``); ``content`` a string or an array of
  content blocks, each an object whose ``type`` is a known block type with its required fields (text:
  ``text``; image: ``source`` base64 ``{media_type, data}`` or url ``{url}``; document: ``source``;
  tool_use: ``id``, ``name``, ``input`` object; tool_result: ``tool_use_id``, ``content`` a string or an
  array of text/image blocks; thinking: ``thinking``, ``signature``; redacted_thinking: ``data``).
- ``tool_use`` only in assistant turns and ``tool_result`` only in user turns; each ``tool_result`` answers
  a ``tool_use`` of the turn just before, and each ``tool_use`` followed by a turn is answered in it.
- ``system`` a string or an array of text blocks; ``stop_sequences`` an array of strings; ``stream`` a
  boolean; ``temperature`` 0–1, ``top_p`` 0–1, ``top_k`` an integer ≥ 0; ``metadata`` an object.
- ``tools`` an array; a custom tool (no ``type``, or ``custom``) has a ``name`` matching
  ``^[a-zA-Z0-9_-]{1,128}$``, an ``input_schema`` object and an optional string ``description``; a
  server tool (``web_search_20250305``, ``bash_20250124``, ...) needs only a ``name`` (llmman drops those,
  see :func:`llmman.protocol.anthropic.prepare_request`).
- ``tool_choice`` ``{type: auto|any|none}`` or ``{type: tool, name}`` naming one of ``tools``;
  ``disable_parallel_tool_use`` a boolean.
- ``thinking`` ``{type: disabled}``, ``{type: adaptive}``, ``{type: between_tools}`` or ``{type: enabled,
  budget_tokens}`` with ``1024 ≤ budget_tokens < max_tokens``; thinking may not be enabled while
  ``tool_choice`` forces a tool.

Pure functions, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from llmman.errors import BadRequest
from llmman.protocol.json_values import is_int, is_number, json_number
from llmman.protocol.limits import InputLimit, check_request

__all__ = ["BLOCK_TYPES", "forced_tool", "is_server_tool", "validate_request"]

#: Content block types accepted in messages (the ``anthropic`` SDK's ``ContentBlockParam``). The results
#: of Anthropic's own server tools are accepted unchecked: a local model has nothing to do with them.
BLOCK_TYPES = ("text", "image", "document", "search_result", "tool_use", "tool_result", "thinking",
               "redacted_thinking", "server_tool_use", "web_search_tool_result", "web_fetch_tool_result",
               "code_execution_tool_result", "bash_code_execution_tool_result",
               "text_editor_code_execution_tool_result", "tool_search_tool_result", "container_upload")
#: Block types a ``tool_result``'s ``content`` array may hold.
RESULT_BLOCK_TYPES = ("text", "image", "document", "search_result", "tool_reference", "browser_state")
_USER_ONLY = frozenset({"tool_result"})
_ASSISTANT_ONLY = frozenset({"tool_use", "thinking", "redacted_thinking", "server_tool_use"})
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_TOOL_CHOICES = ("auto", "any", "tool", "none")
_THINKING = ("enabled", "disabled", "adaptive", "between_tools")
_ROLES = ("user", "assistant", "system")


def _fail(path: str, problem: str) -> BadRequest:
    return BadRequest(f"{path}: {problem}")



def _tags(values: Sequence[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _tag(path: str, value: object, allowed: Sequence[str]) -> BadRequest:
    if not isinstance(value, str):
        return _fail(path, f"Input should be a valid string (one of {_tags(allowed)})")
    return _fail(path, f"Input tag '{value}' found using 'type' does not match any of the expected tags: "
                       f"{_tags(allowed)}")


def _string(obj: Mapping[str, object], key: str, path: str, *, required: bool = True) -> None:
    value = obj.get(key)
    if value is None:
        if required:
            raise _fail(f"{path}.{key}", "Field required")
        return
    if not isinstance(value, str):
        raise _fail(f"{path}.{key}", "Input should be a valid string")


def _object(obj: Mapping[str, object], key: str, path: str, *, required: bool = True) -> None:
    value = obj.get(key)
    if value is None:
        if required:
            raise _fail(f"{path}.{key}", "Field required")
        return
    if not isinstance(value, dict):
        raise _fail(f"{path}.{key}", "Input should be a valid dictionary")


def _source(block: Mapping[str, object], path: str, kinds: Sequence[str]) -> None:
    _object(block, "source", path)
    source = block["source"]
    assert isinstance(source, dict)
    kind = source.get("type")
    if kind not in kinds:
        raise _tag(f"{path}.source.type", kind, kinds)
    if kind == "base64":
        _string(source, "media_type", f"{path}.source")
        _string(source, "data", f"{path}.source")
    elif kind == "url":
        _string(source, "url", f"{path}.source")
    elif kind == "text":
        _string(source, "data", f"{path}.source")
    elif kind == "content" and not isinstance(source.get("content"), str | list):
        raise _fail(f"{path}.source.content", "Input should be a valid string or list")


def _block(block: object, path: str, allowed: Sequence[str] = BLOCK_TYPES) -> str:
    """Check one content block; returns its type."""
    if not isinstance(block, dict):
        raise _fail(path, "Input should be a valid dictionary")
    kind = block.get("type")
    if kind not in allowed:
        raise _tag(f"{path}.type", kind, allowed)
    assert isinstance(kind, str)
    if kind == "text":
        _string(block, "text", path)
    elif kind == "image":
        _source(block, path, ("base64", "url"))
    elif kind == "document":
        _source(block, path, ("base64", "url", "text", "content"))
    elif kind in ("tool_use", "server_tool_use"):
        _string(block, "id", path)
        _string(block, "name", path)
        _object(block, "input", path)
    elif kind == "tool_result":
        _string(block, "tool_use_id", path)
        content = block.get("content")
        if content is not None and not isinstance(content, str):
            if not isinstance(content, list):
                raise _fail(f"{path}.content", "Input should be a valid string or a list of content blocks")
            for i, inner in enumerate(content):
                _block(inner, f"{path}.content.{i}", RESULT_BLOCK_TYPES)
        if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
            raise _fail(f"{path}.is_error", "Input should be a valid boolean")
    elif kind == "thinking":
        _string(block, "thinking", path)
        _string(block, "signature", path)
    elif kind == "redacted_thinking":
        _string(block, "data", path)
    elif kind == "search_result":
        _string(block, "source", path)
        _string(block, "title", path)
        if not isinstance(block.get("content"), list):
            raise _fail(f"{path}.content", "Input should be a valid list")
    if block.get("cache_control") is not None and not isinstance(block["cache_control"], dict):
        raise _fail(f"{path}.cache_control", "Input should be a valid dictionary")
    return kind


def _ids(content: object, kind: str, key: str) -> list[str]:
    if not isinstance(content, list):
        return []
    return [str(b[key]) for b in content if isinstance(b, dict) and b.get("type") == kind]


def _messages(messages: object) -> None:
    if messages is None:
        raise _fail("messages", "Field required")
    if not isinstance(messages, list):
        raise _fail("messages", "Input should be a valid list")
    if not messages:
        raise _fail("messages", "at least one message is required")
    for i, msg in enumerate(messages):
        path = f"messages.{i}"
        if not isinstance(msg, dict):
            raise _fail(path, "Input should be a valid dictionary")
        role = msg.get("role")
        if role is None:
            raise _fail(f"{path}.role", "Field required")
        if role not in _ROLES:
            raise _fail(f"{path}.role", "Input should be 'user' or 'assistant'")
        content = msg.get("content")
        if content is None:
            raise _fail(f"{path}.content", "Field required")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise _fail(f"{path}.content", "Input should be a valid string or a list of content blocks")
        for j, block in enumerate(content):
            kind = _block(block, f"{path}.content.{j}")
            if role == "system" and kind != "text":
                raise _fail(f"{path}.content.{j}.type", "a system message may only hold text blocks")
            if kind in _USER_ONLY and role != "user":
                raise _fail(f"{path}.content.{j}", f"`{kind}` blocks can only be in `user` messages")
            if kind in _ASSISTANT_ONLY and role != "assistant":
                raise _fail(f"{path}.content.{j}", f"`{kind}` blocks can only be in `assistant` messages")
    _tool_pairs(messages)


def _tool_pairs(messages: list[object]) -> None:
    """Each ``tool_result`` answers a ``tool_use`` of the turn before; each answered ``tool_use`` turn is
    followed by its results (system messages, which llmman moves out, are skipped)."""
    turns = [(i, m) for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") != "system"]
    for n, (i, msg) in enumerate(turns):
        assert isinstance(msg, dict)
        results = _ids(msg.get("content"), "tool_result", "tool_use_id")
        if results:
            before = turns[n - 1][1] if n else {}
            uses = set(_ids(before.get("content") if isinstance(before, dict) else None, "tool_use", "id"))
            unexpected = [r for r in results if r not in uses]
            if unexpected:
                ids = ", ".join(unexpected)
                raise _fail(f"messages.{i}.content",
                            f"unexpected `tool_use_id` found in `tool_result` blocks: {ids}. "
                            "Each `tool_result` block must have a corresponding `tool_use` block in the "
                            "previous message.")
        uses_here = _ids(msg.get("content"), "tool_use", "id")
        if uses_here and n + 1 < len(turns):
            following = turns[n + 1][1]
            answered = set(_ids(following.get("content") if isinstance(following, dict) else None,
                                "tool_result", "tool_use_id"))
            missing = [u for u in uses_here if u not in answered]
            if missing:
                raise _fail(f"messages.{i}", f"`tool_use` ids were found without `tool_result` blocks "
                            f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                            "corresponding `tool_result` block in the next message.")


def _system(system: object) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise _fail("system", "Input should be a valid string or a list of text blocks")
    for i, block in enumerate(system):
        _block(block, f"system.{i}", ("text",))


def is_server_tool(tool: Mapping[str, object]) -> bool:
    """A tool Anthropic runs itself (``web_search_20250305``, ``bash_20250124``, ...): it has a ``type``
    other than ``custom``. A local model cannot run these."""
    kind = tool.get("type")
    return kind is not None and kind != "custom"


def _tools(tools: object) -> list[str]:
    """Check ``tools``; returns the custom tools' names."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _fail("tools", "Input should be a valid list")
    names: list[str] = []
    for i, tool in enumerate(tools):
        path = f"tools.{i}"
        if not isinstance(tool, dict):
            raise _fail(path, "Input should be a valid dictionary")
        name = tool.get("name")
        if name is None:
            raise _fail(f"{path}.name", "Field required")
        if not isinstance(name, str):
            raise _fail(f"{path}.name", "Input should be a valid string")
        if tool.get("type") is not None and not isinstance(tool["type"], str):
            raise _fail(f"{path}.type", "Input should be a valid string")
        if is_server_tool(tool):
            continue
        if not _TOOL_NAME.match(name):
            raise _fail(f"{path}.name", "String should match pattern '^[a-zA-Z0-9_-]{1,128}$'")
        _object(tool, "input_schema", path)
        _string(tool, "description", path, required=False)
        names.append(name)
    return names


def _tool_choice(choice: object, names: list[str]) -> str | None:
    """Check ``tool_choice``; returns its type (None when absent)."""
    if choice is None:
        return None
    if not isinstance(choice, dict):
        raise _fail("tool_choice", "Input should be a valid dictionary")
    kind = choice.get("type")
    if kind not in _TOOL_CHOICES:
        raise _tag("tool_choice.type", kind, _TOOL_CHOICES)
    assert isinstance(kind, str)
    if kind == "tool":
        _string(choice, "name", "tool_choice")
        if choice["name"] not in names:
            raise _fail("tool_choice.name", f"tool '{choice['name']}' is not one of the request's tools")
    if kind in ("any", "tool") and not names:
        raise _fail("tool_choice", f"tool_choice.type '{kind}' needs at least one tool in `tools`")
    if choice.get("disable_parallel_tool_use") is not None and not isinstance(
            choice["disable_parallel_tool_use"], bool):
        raise _fail("tool_choice.disable_parallel_tool_use", "Input should be a valid boolean")
    return kind


def _range(body: Mapping[str, object], key: str, low: float, high: float | None = None,
           *, integer: bool = False) -> None:
    value = body.get(key)
    if value is None:
        return
    if not (is_int(value) if integer else is_number(value)):
        raise _fail(key, "Input should be a valid integer" if integer else "Input should be a valid number")
    assert isinstance(value, int | float)
    if value < low:
        raise _fail(key, f"Input should be greater than or equal to {json_number(low)}")
    if high is not None and value > high:
        raise _fail(key, f"Input should be less than or equal to {json_number(high)}")


def _thinking(thinking: object, max_tokens: object, choice: str | None) -> None:
    if thinking is None:
        return
    if not isinstance(thinking, dict):
        raise _fail("thinking", "Input should be a valid dictionary")
    kind = thinking.get("type")
    if kind not in _THINKING:
        raise _tag("thinking.type", kind, _THINKING)
    if kind != "enabled":
        return
    budget = thinking.get("budget_tokens")
    if budget is None:
        raise _fail("thinking.enabled.budget_tokens", "Field required")
    if not is_int(budget):
        raise _fail("thinking.enabled.budget_tokens", "Input should be a valid integer")
    assert isinstance(budget, int)
    if budget < 1024:
        raise _fail("thinking.enabled.budget_tokens", "Input should be greater than or equal to 1024")
    if isinstance(max_tokens, int) and budget >= max_tokens:
        raise BadRequest("`max_tokens` must be greater than `thinking.budget_tokens`")
    if choice in ("any", "tool"):
        raise BadRequest("Thinking may not be enabled when tool_choice forces tool use.")


def validate_request(body: object, *, count_tokens: bool = False) -> None:
    """Check an Anthropic ``/v1/messages`` body (``count_tokens``: a ``/v1/messages/count_tokens`` body,
    where ``max_tokens`` is not taken). The rules are the module's.

    Raises:
        BadRequest: the first problem, ``<path>: <problem>``.
    """
    if not isinstance(body, dict):
        raise BadRequest("The request body is not a JSON object")
    try:
        check_request(body)  # nesting, grammar, schemas, tools, stop_sequences (llmman.protocol.limits)
    except InputLimit as exc:
        raise _fail(exc.param, exc.problem) from None
    model = body.get("model")
    if model is None or model == "":
        raise _fail("model", "Field required")
    if not isinstance(model, str):
        raise _fail("model", "Input should be a valid string")
    max_tokens = body.get("max_tokens")
    if not count_tokens:
        if max_tokens is None:
            raise _fail("max_tokens", "Field required")
        _range(body, "max_tokens", 1, 2**31 - 1, integer=True)
    _messages(body.get("messages"))
    _system(body.get("system"))
    names = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"), names)
    _thinking(body.get("thinking"), None if count_tokens else max_tokens, choice)
    if count_tokens:
        return
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise _fail("stream", "Input should be a valid boolean")
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list):
            raise _fail("stop_sequences", "Input should be a valid list")
        for i, stop in enumerate(stops):
            if not isinstance(stop, str):
                raise _fail(f"stop_sequences.{i}", "Input should be a valid string")
    _range(body, "temperature", 0, 1)
    _range(body, "top_p", 0, 1)
    _range(body, "top_k", 0, integer=True)
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise _fail("metadata", "Input should be a valid dictionary")


def forced_tool(body: Mapping[str, object]) -> list[dict[str, object]] | None:
    """The custom tools a (validated) request forces the model to call from, or None when it does not
    force one: ``tool_choice {type: tool, name}`` gives that tool, ``{type: any}`` every custom tool."""
    choice = body.get("tool_choice")
    if not isinstance(choice, dict) or choice.get("type") not in ("tool", "any"):
        return None
    listed = body.get("tools")
    listed = listed if isinstance(listed, list) else []
    tools = [t for t in listed if isinstance(t, dict) and not is_server_tool(t)]
    if choice["type"] == "tool":
        tools = [t for t in tools if t.get("name") == choice.get("name")]
    return tools or None
