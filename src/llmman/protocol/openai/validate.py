"""A light check of OpenAI request bodies before they are passed to llama-server byte for byte.

llama-server answers most malformed fields with its own 400, but some (a message without ``role``, a
tool without ``function``, a text part without ``text``, an assistant ``tool_calls`` that is not a list)
fail inside its chat-template code and come back as a **500** (llama-server's catch-all status). So llmman
checks the shapes OpenAI itself checks, before forwarding, and answers OpenAI's 400::

    {"error": {"message": "Invalid type for 'messages[0].content': expected one of a string or array
               of objects, but got an integer instead.", "type": "invalid_request_error",
               "param": "messages[0].content", "code": null}}

The wording follows OpenAI's (``Missing required parameter: 'messages'.``, ``Invalid type for 'x':
expected ..., but got ... instead.``, ``Invalid value: 'bogus'. Supported values are: ...``).

Deliberately light: only the structure (types, required keys, enumerations) and the ranges OpenAI
documents for the common sampling fields; ``null`` counts as absent for optional fields; unknown fields
and llama-server's own extensions pass unchecked; values llama-server range-checks itself (``n`` against
its slots, ``max_tokens`` ≥ -1) are left to it. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from llmman.errors import BadRequest
from llmman.protocol.json_values import is_int, is_number, json_number
from llmman.protocol.limits import InputLimit, check_body_depth, check_request

__all__ = [
    "CHAT_ROLES",
    "REASONING_EFFORTS",
    "InvalidParam",
    "json_kind",
    "validate_chat",
    "validate_completion",
    "validate_embeddings",
    "validate_responses",
    "validate_tools",
]

#: Message roles OpenAI accepts on ``/v1/chat/completions``.
CHAT_ROLES = ("system", "assistant", "user", "function", "tool", "developer")
_PART_TYPES = ("text", "image_url", "input_audio", "refusal", "audio", "file")
_TOOL_CHOICES = ("none", "auto", "required")
_RESPONSE_FORMATS = ("text", "json_object", "json_schema")
#: ``reasoning_effort`` values llmman accepts: OpenAI's, plus the extra levels Ollama maps
#: (Ollama's ``openai/openai.go``: ``minimal`` -> low, ``xhigh``/``ultra`` -> max).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "max", "xhigh", "ultra")


class InvalidParam(BadRequest):
    """A 400 that names the offending parameter (OpenAI's ``param``, e.g. ``messages[0].role``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def json_kind(value: object) -> str:
    """OpenAI's name for a JSON value's type, with its article: ``a string``, ``an integer``, ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _quoted(values: Sequence[str]) -> str:
    items = [f"'{v}'" for v in values]
    return ", ".join(items[:-1]) + ", and " + items[-1] if len(items) > 2 else " and ".join(items)


def _missing(param: str) -> InvalidParam:
    return InvalidParam(f"Missing required parameter: '{param}'.", param)


def _wrong_type(param: str, expected: str, value: object) -> InvalidParam:
    return InvalidParam(
        f"Invalid type for '{param}': expected {expected}, but got {json_kind(value)} instead.", param
    )


def _bad_value(param: str, value: object, allowed: Sequence[str]) -> InvalidParam:
    return InvalidParam(f"Invalid value: '{value}'. Supported values are: {_quoted(allowed)}.", param)



def _number(body: Mapping[str, object], key: str, low: float | None = None, high: float | None = None,
            *, integer: bool = False) -> None:
    value = body.get(key)
    if value is None:
        return
    if not (is_int(value) if integer else is_number(value)):
        raise _wrong_type(key, "an integer" if integer else "a number", value)
    assert isinstance(value, int | float)
    if low is not None and value < low:
        raise InvalidParam(f"Invalid '{key}': value below minimum value. Expected a value >= "
                           f"{json_number(low)}, "
                           f"but got {json_number(value)} instead.", key)
    if high is not None and value > high:
        raise InvalidParam(f"Invalid '{key}': value above maximum value. Expected a value <= "
                           f"{json_number(high)}, "
                           f"but got {json_number(value)} instead.", key)


def _typed(body: Mapping[str, object], key: str, typ: type, expected: str) -> None:
    value = body.get(key)
    if value is not None and (not isinstance(value, typ) or (typ is int and isinstance(value, bool))):
        raise _wrong_type(key, expected, value)


def _stop(body: Mapping[str, object]) -> None:
    stop = body.get("stop")
    if stop is None or isinstance(stop, str):
        return
    if not isinstance(stop, list):
        raise _wrong_type("stop", "one of a string or array of strings", stop)
    for i, item in enumerate(stop):
        if not isinstance(item, str):
            raise _wrong_type(f"stop[{i}]", "a string", item)


def _stream_options(body: Mapping[str, object]) -> None:
    options = body.get("stream_options")
    if options is None:
        return
    if not isinstance(options, dict):
        raise _wrong_type("stream_options", "an object", options)
    _typed(options, "include_usage", bool, "a boolean")


def _common(body: Mapping[str, object]) -> None:
    """The sampling and streaming fields chat and text completions share."""
    _typed(body, "stream", bool, "a boolean")
    _stream_options(body)
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    _number(body, "presence_penalty", -2, 2)
    _number(body, "frequency_penalty", -2, 2)
    _number(body, "max_tokens", integer=True)
    _number(body, "max_completion_tokens", integer=True)
    _number(body, "n", 1, integer=True)
    _number(body, "seed", integer=True)
    _stop(body)
    _typed(body, "user", str, "a string")
    _typed(body, "logit_bias", dict, "an object")


def _text_parts(param: str, content: object, check_part: Callable[[str, dict[str, object]], None]) -> None:
    if not isinstance(content, list):
        raise _wrong_type(param, "one of a string or array of objects", content)
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise _wrong_type(where, "an object", part)
        check_part(where, part)


def _content_part(where: str, part: dict[str, object]) -> None:
    kind = part.get("type")
    if kind is None:
        raise _missing(f"{where}.type")
    if kind not in _PART_TYPES:
        raise _bad_value(f"{where}.type", kind, _PART_TYPES)
    if kind == "text":
        if "text" not in part:
            raise _missing(f"{where}.text")
        if not isinstance(part["text"], str):
            raise _wrong_type(f"{where}.text", "a string", part["text"])
    elif kind == "image_url":
        image = part.get("image_url")
        if image is None:
            raise _missing(f"{where}.image_url")
        if isinstance(image, dict):
            if not isinstance(image.get("url"), str):
                raise (_missing(f"{where}.image_url.url") if image.get("url") is None
                       else _wrong_type(f"{where}.image_url.url", "a string", image["url"]))
        elif not isinstance(image, str):
            raise _wrong_type(f"{where}.image_url", "an object", image)
    elif kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict):
            raise _missing(f"{where}.input_audio") if audio is None else _wrong_type(
                f"{where}.input_audio", "an object", audio)
        if not isinstance(audio.get("data"), str):
            raise _missing(f"{where}.input_audio.data")


def _tool_calls(where: str, calls: object) -> None:
    if not isinstance(calls, list):
        raise _wrong_type(where, "an array", calls)
    for k, call in enumerate(calls):
        at = f"{where}[{k}]"
        if not isinstance(call, dict):
            raise _wrong_type(at, "an object", call)
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise _wrong_type(f"{at}.id", "a string", call["id"])
        if call.get("type") != "function":
            raise _missing(f"{at}.type") if call.get("type") is None else _bad_value(
                f"{at}.type", call["type"], ("function",))
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise _missing(f"{at}.function") if fn is None else _wrong_type(f"{at}.function", "an object", fn)
        if not isinstance(fn.get("name"), str):
            raise _missing(f"{at}.function.name") if fn.get("name") is None else _wrong_type(
                f"{at}.function.name", "a string", fn["name"])
        if fn.get("arguments") is not None and not isinstance(fn["arguments"], str | dict):
            # a JSON object too: replayed history from a client (or a child) that wrote one; the route
            # sends it on as its JSON string (llmman.protocol.openai.stream.stringify_arguments)
            raise _wrong_type(f"{at}.function.arguments", "a string", fn["arguments"])


def _message(i: int, msg: object) -> None:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise _wrong_type(where, "an object", msg)
    role = msg.get("role")
    if role is None:
        raise _missing(f"{where}.role")
    if not isinstance(role, str):
        raise _wrong_type(f"{where}.role", "a string", role)
    if role not in CHAT_ROLES:
        raise _bad_value(f"{where}.role", role, CHAT_ROLES)
    for key in ("name", "tool_call_id", "reasoning_content"):
        if msg.get(key) is not None and not isinstance(msg[key], str):
            raise _wrong_type(f"{where}.{key}", "a string", msg[key])
    content = msg.get("content")
    if role == "assistant":
        if msg.get("tool_calls") is not None:
            _tool_calls(f"{where}.tool_calls", msg["tool_calls"])
        if content is None:
            return  # an assistant turn may carry only tool calls (or nothing)
    elif content is None:
        raise _missing(f"{where}.content")
    if not isinstance(content, str):
        _text_parts(f"{where}.content", content, _content_part)


def validate_tools(tools: object, param: str = "tools") -> None:
    """Check a ``tools`` array: each ``{"type": "function", "function": {"name": str, "description"?: str,
    "parameters"?: object, "strict"?: bool}}``.

    Raises:
        InvalidParam: naming the first bad entry, e.g. ``tools[0].function.name``.
    """
    if tools is None:
        return
    if not isinstance(tools, list):
        raise _wrong_type(param, "an array", tools)
    for i, tool in enumerate(tools):
        where = f"{param}[{i}]"
        if not isinstance(tool, dict):
            raise _wrong_type(where, "an object", tool)
        if tool.get("type") != "function":
            raise _missing(f"{where}.type") if tool.get("type") is None else _bad_value(
                f"{where}.type", tool["type"], ("function",))
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise _missing(f"{where}.function") if fn is None else _wrong_type(
                f"{where}.function", "an object", fn)
        name = fn.get("name")
        if name is None:
            raise _missing(f"{where}.function.name")
        if not isinstance(name, str):
            raise _wrong_type(f"{where}.function.name", "a string", name)
        if not name:
            raise InvalidParam(f"Invalid '{where}.function.name': empty string. Expected a string with "
                               "minimum length 1, but got an empty string instead.", f"{where}.function.name")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise _wrong_type(f"{where}.function.description", "a string", fn["description"])
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _wrong_type(f"{where}.function.parameters", "an object", fn["parameters"])
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise _wrong_type(f"{where}.function.strict", "a boolean", fn["strict"])


def _tool_choice(choice: object) -> None:
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in _TOOL_CHOICES:
            raise _bad_value("tool_choice", choice, _TOOL_CHOICES)
        return
    if not isinstance(choice, dict):
        raise _wrong_type("tool_choice", "one of a string or object", choice)
    if choice.get("type") != "function":
        raise _missing("tool_choice.type") if choice.get("type") is None else _bad_value(
            "tool_choice.type", choice["type"], ("function",))
    fn = choice.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise _missing("tool_choice.function.name")


def _response_format(fmt: object) -> None:
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise _wrong_type("response_format", "an object", fmt)
    kind = fmt.get("type")
    if kind is None:
        raise _missing("response_format.type")
    if kind not in _RESPONSE_FORMATS:
        raise _bad_value("response_format.type", kind, _RESPONSE_FORMATS)
    if kind == "json_schema":
        schema = fmt.get("json_schema")
        if not isinstance(schema, dict):
            raise _missing("response_format.json_schema") if schema is None else _wrong_type(
                "response_format.json_schema", "an object", schema)


def _limits(body: Mapping[str, object], *, depth_only: bool = False) -> None:
    """The input bounds of :mod:`llmman.protocol.limits` (nesting, grammar, schemas, tools, stops)."""
    try:
        check_body_depth(body) if depth_only else check_request(body)
    except InputLimit as exc:
        raise InvalidParam(f"Invalid '{exc.param}': {exc.problem}.", exc.param) from None


def validate_responses(body: Mapping[str, object]) -> None:
    """Check a ``/v1/responses`` body against the input bounds (its shapes are llama-server's to judge).

    Raises:
        InvalidParam: naming the field past a bound.
    """
    _limits(body)


def _reasoning_effort(body: Mapping[str, object]) -> None:
    effort = body.get("reasoning_effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise _wrong_type("reasoning_effort", "a string", effort)
        if effort not in REASONING_EFFORTS:
            raise _bad_value("reasoning_effort", effort, REASONING_EFFORTS)
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise _wrong_type("reasoning", "an object", reasoning)
        effort = reasoning.get("effort")
        if effort is not None and effort not in REASONING_EFFORTS:
            raise _bad_value("reasoning.effort", effort, REASONING_EFFORTS)


def validate_chat(body: Mapping[str, object]) -> None:
    """Check a ``/v1/chat/completions`` body (``model`` was checked by ``peek_model``).

    ``messages``: a non-empty array of objects with a ``role`` of :data:`CHAT_ROLES` and a string or
    array-of-parts ``content`` (optional for assistant turns, which may carry ``tool_calls``); parts of
    type text / image_url / input_audio / refusal / audio / file with their required keys. ``tools``: see
    :func:`validate_tools`. ``tool_choice``: none / auto / required or ``{"type": "function", "function":
    {"name"}}``. Common fields: ``stream``, ``stream_options``, ``temperature`` (0–2), ``top_p`` (0–1),
    penalties (-2–2), ``max_tokens``/``max_completion_tokens``/``seed`` (integers), ``n`` (≥ 1), ``stop``
    (string or array of strings), ``logprobs`` (boolean), ``top_logprobs`` (0–20), ``response_format``,
    ``parallel_tool_calls`` (boolean), ``reasoning_effort``.

    Raises:
        InvalidParam: the first problem found, with its ``param``; input past the bounds of
            :mod:`llmman.protocol.limits` first.
    """
    _limits(body)
    messages = body.get("messages")
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list):
        raise _wrong_type("messages", "an array", messages)
    if not messages:
        raise InvalidParam("[] is too short - 'messages'", "messages")  # OpenAI's and Ollama's words
    for i, msg in enumerate(messages):
        _message(i, msg)
    validate_tools(body.get("tools"))
    _tool_choice(body.get("tool_choice"))
    _common(body)
    _typed(body, "logprobs", bool, "a boolean")
    _number(body, "top_logprobs", 0, 20, integer=True)
    _typed(body, "parallel_tool_calls", bool, "a boolean")
    _response_format(body.get("response_format"))
    _reasoning_effort(body)


def validate_completion(body: Mapping[str, object]) -> None:
    """Check a ``/v1/completions`` body: ``prompt`` (required) a string, an array of strings, an array of
    token ids or an array of such arrays; ``suffix`` a string; ``echo`` a boolean; ``logprobs`` an integer
    0–5; ``best_of`` ≥ 1; plus the common fields of :func:`validate_chat`.

    Raises:
        InvalidParam: the first problem found, with its ``param``.
    """
    _limits(body)
    prompt = body.get("prompt")
    if prompt is None:
        raise _missing("prompt")
    if not isinstance(prompt, str):
        expected = "one of a string, array of strings, array of integers, or array of arrays of integers"
        if not isinstance(prompt, list):
            raise _wrong_type("prompt", expected, prompt)
        for i, item in enumerate(prompt):
            ok = isinstance(item, str) or is_int(item) or (
                isinstance(item, list) and all(is_int(t) for t in item))
            if not ok:
                raise _wrong_type(f"prompt[{i}]", "a string, an integer or an array of integers", item)
    _common(body)
    _typed(body, "suffix", str, "a string")
    _typed(body, "echo", bool, "a boolean")
    _number(body, "logprobs", 0, 5, integer=True)
    _number(body, "best_of", 1, integer=True)


def validate_embeddings(body: Mapping[str, object]) -> int | None:
    """Check a ``/v1/embeddings`` body and return its ``dimensions`` (None when absent).

    ``input`` (required): a string, an array of strings, an array of token ids or an array of such arrays,
    non-empty; ``dimensions``: an integer ≥ 1; ``encoding_format``: ``float`` or ``base64``; ``user``: a
    string.

    Raises:
        InvalidParam: the first problem found, with its ``param``.
    """
    _limits(body, depth_only=True)
    data = body.get("input")
    if data is None:
        raise _missing("input")
    expected = "one of a string, array of strings, array of integers, or array of arrays of integers"
    if isinstance(data, list):
        if not data:
            raise InvalidParam("Invalid 'input': empty array. Expected an array with minimum length 1, "
                               "but got an empty array instead.", "input")
        for i, item in enumerate(data):
            if not (isinstance(item, str) or is_int(item)
                    or (isinstance(item, list) and item and all(is_int(t) for t in item))):
                raise _wrong_type(f"input[{i}]", "a string, an integer or an array of integers", item)
    elif not isinstance(data, str):
        raise _wrong_type("input", expected, data)
    fmt = body.get("encoding_format")
    if fmt is not None and fmt not in ("float", "base64"):
        raise _bad_value("encoding_format", fmt, ("float", "base64"))
    _typed(body, "user", str, "a string")
    dims = body.get("dimensions")
    if dims is None:
        return None
    if not is_int(dims):
        raise _wrong_type("dimensions", "an integer", dims)
    assert isinstance(dims, int)
    if dims < 1:
        raise InvalidParam(f"Invalid 'dimensions': integer below minimum value. Expected a value >= 1, "
                           f"but got {dims} instead.", "dimensions")
    return dims
