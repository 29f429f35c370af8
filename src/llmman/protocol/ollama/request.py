"""Ollama ``/api/chat`` and ``/api/generate`` bodies -> one llama-server request.

The upstream request ALWAYS streams (``"stream": true`` with ``stream_options.include_usage``): llmman
aggregates for ``stream:false`` itself, so there is one code path (the old llmman ignored ``stream:false``).
Field rules: Ollama's ``api.ChatRequest``/``api.GenerateRequest`` (``api/types.go``) in, llama-server's
``/v1/chat/completions`` and ``/v1/completions`` bodies out.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Literal

import orjson

from llmman.durations import parse_duration
from llmman.errors import BadRequest
from llmman.protocol.limits import check_request, check_schema, check_stops
from llmman.protocol.ollama.fields import (
    RunnerOptions,
    format_to_response_format,
    options_to_sampling,
    require_model,
    runner_options,
    think_fields,
    unknown_options,
    validate_think,
)
from llmman.protocol.openai.validate import validate_tools

__all__ = [
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "INFILL_PATH",
    "UpstreamRequest",
    "chat_request",
    "generate_request",
    "image_url",
    "with_default_think",
]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
INFILL_PATH = "/infill"  # llama-server's fill-in-the-middle (native chunks: protocol/ollama/infill.py)
_STREAM_OPTIONS = {"stream": True, "stream_options": {"include_usage": True}}

#: base64 prefixes of the image formats llama-server's decoder reads (magic bytes, base64-encoded).
_IMAGE_MAGIC = (
    ("/9j/", "image/jpeg"),
    ("iVBORw0KGgo", "image/png"),
    ("R0lGOD", "image/gif"),
    ("UklGR", "image/webp"),
)


@dataclass(frozen=True)
class UpstreamRequest:
    """What to send to llama-server for one Ollama request, plus what the caller needs to answer.

    ``stream`` is what the CLIENT asked (default True); ``body`` always streams. ``is_load`` marks an empty
    prompt / empty ``messages``: a load-or-unload request, no upstream call. ``keep_alive`` is the raw JSON
    value (None when absent). ``ignored_options`` are unknown ``options`` keys, for a warning. ``truncate``
    is Ollama's ``truncate`` (default True): a prompt longer than the context is cut to fit
    (protocol/ollama/truncate.py) instead of refused. ``path`` is :data:`INFILL_PATH` for a ``suffix``.
    """

    path: str
    body: dict[str, object]
    stream: bool
    kind: Literal["chat", "generate"]
    model: str
    keep_alive: object
    runner: RunnerOptions
    is_load: bool
    think: bool | str | None
    ignored_options: tuple[str, ...] = field(default=())
    truncate: bool = True

    @property
    def keep_alive_s(self) -> float | None:
        """``keep_alive`` in seconds (None: absent; negative: forever). Raises BadRequest when malformed."""
        return None if self.keep_alive is None else parse_duration(self.keep_alive)

    @property
    def unloads(self) -> bool:
        """Ollama's unload: nothing to generate and a zero ``keep_alive`` in any spelling (``0``, ``"0"``,
        ``"0s"``, ``"0m"``, ``"0h"``, ``"0ms"``, ``0.0``). Raises BadRequest for a malformed value."""
        return self.is_load and self.keep_alive_s == 0


def image_url(b64: str) -> str:
    """A ``data:`` URI for a bare base64 image, its type sniffed from the magic bytes (png when unknown).

    A value that is already a ``data:`` URI is returned unchanged.
    """
    if b64.startswith("data:"):
        return b64
    mime = next((m for prefix, m in _IMAGE_MAGIC if b64.startswith(prefix)), "image/png")
    return f"data:{mime};base64,{b64}"


def _opt(body: dict[str, object], key: str, typ: type, name: str) -> object:
    value = body.get(key)
    if value is not None and (not isinstance(value, typ) or (typ is int and isinstance(value, bool))):
        raise BadRequest(f"{key} must be {name}")
    return value


def _str(body: dict[str, object], key: str) -> str:
    value = _opt(body, key, str, "a string")
    return value if isinstance(value, str) else ""


def _images(value: object, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise BadRequest(f"{where} must be an array of base64 strings")
    return list(value)


def _content(text: str, images: list[str]) -> object:
    """OpenAI message content: the plain string, or parts when there are images."""
    if not images:
        return text
    parts: list[dict[str, object]] = [{"type": "text", "text": text}] if text else []
    parts += [{"type": "image_url", "image_url": {"url": image_url(b64)}} for b64 in images]
    return parts


def _tool_calls(value: object, m: int, ids: dict[str, str]) -> list[dict[str, object]]:
    """Ollama tool calls (object ``arguments``) -> OpenAI tool calls (JSON-string ``arguments``, ids)."""
    if not isinstance(value, list):
        raise BadRequest(f"messages[{m}].tool_calls must be an array")
    out: list[dict[str, object]] = []
    for i, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest(f"messages[{m}].tool_calls[{i}] must have a function with a string name")
        args = fn.get("arguments")
        if args is None:
            args = {}
        if not isinstance(args, dict | str):
            raise BadRequest(f"messages[{m}].tool_calls[{i}].function.arguments must be an object")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{m:05d}{i:03d}"  # deterministic: 8 digits, Ollama's call_ + 8 characters shape
        name = str(fn["name"])
        ids[name] = call_id
        arguments = args if isinstance(args, str) else orjson.dumps(args).decode()
        out.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    return out


def _messages(value: object) -> list[dict[str, object]]:
    """Ollama ``messages`` -> OpenAI messages (roles lowercased, images as parts, tool calls/results linked).

    ``content`` may be absent or null for any role and then counts as ``""`` (Go's zero value, as in Ollama).
    A ``tool`` message without ``tool_call_id`` is linked through ``tool_name`` to the latest such call.
    """
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest("messages must be an array")
    out: list[dict[str, object]] = []
    ids: dict[str, str] = {}
    for m, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise BadRequest(f"messages[{m}] must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise BadRequest(f"messages[{m}].role must be a non-empty string")
        role = role.lower()
        text = _str(msg, "content")
        item: dict[str, object] = {
            "role": role,
            "content": _content(text, _images(msg.get("images"), "images")),
        }
        thinking = _str(msg, "thinking")
        if role == "assistant":
            if thinking:
                item["reasoning_content"] = thinking
            if msg.get("tool_calls") is not None:
                calls = _tool_calls(msg["tool_calls"], m, ids)
                if calls:
                    item["tool_calls"] = calls
        elif role == "tool":
            tool_name = _str(msg, "tool_name")
            call_id = _str(msg, "tool_call_id") or ids.get(tool_name, "")
            if call_id:
                item["tool_call_id"] = call_id
            if tool_name:
                item["name"] = tool_name
        out.append(item)
    return out


def _common(body: dict[str, object]) -> tuple[str, bool, bool | str | None, dict[str, object]]:
    """model, client stream flag, think, and the upstream fields shared by chat and generate."""
    model = require_model(body)
    check_request(body)  # input bounds (llmman.protocol.limits): nesting, tools, ...
    check_schema(body.get("format"), "format")
    options = body.get("options")
    check_stops(options.get("stop") if isinstance(options, dict) else None, "options.stop")
    stream = _opt(body, "stream", bool, "a boolean")
    think = validate_think(body.get("think"))
    fields: dict[str, object] = {"model": model, **options_to_sampling(body.get("options"))}
    if _opt(body, "logprobs", bool, "a boolean"):
        fields["logprobs"] = True
        top = _opt(body, "top_logprobs", int, "an integer")
        if isinstance(top, int):
            if not 0 <= top <= 20:
                raise BadRequest("top_logprobs must be between 0 and 20")
            fields["top_logprobs"] = top
    return model, stream is not False, think, fields


def _finish(
    kind: Literal["chat", "generate"],
    path: str,
    body: dict[str, object],
    upstream: dict[str, object],
    model: str,
    stream: bool,
    think: bool | str | None,
    is_load: bool,
) -> UpstreamRequest:
    upstream.update(_STREAM_OPTIONS)
    options = body.get("options")
    truncate = _opt(body, "truncate", bool, "a boolean")
    return UpstreamRequest(
        path=path,
        body=upstream,
        stream=stream,
        kind=kind,
        model=model,
        keep_alive=body.get("keep_alive"),
        runner=runner_options(options),
        is_load=is_load,
        think=think,
        ignored_options=unknown_options(options),
        truncate=truncate is not False,
    )


def chat_request(body: dict[str, object]) -> UpstreamRequest:
    """Translate an Ollama ``/api/chat`` body to a streaming ``POST /v1/chat/completions``.

    Fields: model, messages, stream, options (sampling merged in), format (-> response_format), tools
    (passed through, already OpenAI shape), think (:func:`~llmman.protocol.ollama.think_fields`),
    logprobs/top_logprobs, keep_alive (returned raw), truncate. Empty/absent ``messages`` -> ``is_load``.

    Raises:
        BadRequest: missing model, wrong field types, bad think/format/options values.
    """
    model, stream, think, upstream = _common(body)
    messages = _messages(body.get("messages"))
    upstream["messages"] = messages
    response_format = format_to_response_format(body.get("format"))
    if response_format is not None:
        upstream["response_format"] = response_format
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise BadRequest("tools must be an array of objects")
    validate_tools(tools)  # each {"type": "function", "function": {"name", ...}}: llama-server 500s otherwise
    if tools:
        upstream["tools"] = tools
    upstream.update(think_fields(think))
    return _finish("chat", CHAT_PATH, body, upstream, model, stream, think, not messages)


def _raw_format(fmt: object) -> dict[str, object]:
    """``format`` for ``/v1/completions``, which takes llama-server's native ``json_schema`` field."""
    response_format = format_to_response_format(fmt)
    if response_format is None:
        return {}
    if response_format["type"] == "json_object":
        return {"json_schema": {"type": "object"}}
    return {"json_schema": fmt}


def generate_request(body: dict[str, object]) -> UpstreamRequest:
    """Translate an Ollama ``/api/generate`` body to a streaming llama-server request.

    Not raw: ``system`` + ``prompt`` (+ ``images``) become chat messages on ``/v1/chat/completions`` so the
    model's template applies; ``template`` and ``context`` are ignored (llama-server cannot override the
    template per request; ``context`` is deprecated). Raw: ``prompt`` verbatim on ``/v1/completions``;
    ``think`` is not sent. Empty ``prompt`` (and no images) -> ``is_load``. A ``suffix`` (not raw; raw
    sends the prompt verbatim and ignores it, as Ollama does) is fill-in-the-middle on llama-server's
    ``/infill`` (:data:`INFILL_PATH`): ``input_prefix`` the prompt, ``input_suffix`` the suffix; whether the
    model can (the ``insert`` capability) is the serving step's check.

    Raises:
        BadRequest: as :func:`chat_request`; ``raw mode does not support template, system, or context``;
            ``raw mode does not support images``.
    """
    model, stream, think, upstream = _common(body)
    prompt = _str(body, "prompt")
    system = _str(body, "system")
    template = _str(body, "template")
    context = _opt(body, "context", list, "an array of integers")
    if isinstance(context, list) and not all(isinstance(t, int) and not isinstance(t, bool) for t in context):
        raise BadRequest("context must be an array of integers")  # Ollama's []int refuses any other item
    raw = _opt(body, "raw", bool, "a boolean") is True
    images = _images(body.get("images"), "images")
    if raw and (template or system or context):
        raise BadRequest("raw mode does not support template, system, or context")
    suffix = _str(body, "suffix")
    is_load = not prompt and not images
    if raw:
        if images:
            raise BadRequest("raw mode does not support images")
        upstream["prompt"] = prompt
        if upstream.get("logprobs") is True:  # OpenAI completions take an integer count here
            upstream["logprobs"] = upstream.pop("top_logprobs", None) or 1
        upstream.update(_raw_format(body.get("format")))
        return _finish("generate", COMPLETIONS_PATH, body, upstream, model, stream, think, is_load)
    if suffix:
        upstream.pop("logprobs", None)  # the native endpoint's are n_probs, not asked for here
        upstream.pop("top_logprobs", None)
        upstream.update(input_prefix=prompt, input_suffix=suffix, **_raw_format(body.get("format")))
        return _finish("generate", INFILL_PATH, body, upstream, model, stream, think, is_load)
    messages: list[dict[str, object]] = [{"role": "system", "content": system}] if system else []
    if not is_load:
        messages.append({"role": "user", "content": _content(prompt, images)})
    upstream["messages"] = messages
    response_format = format_to_response_format(body.get("format"))
    if response_format is not None:
        upstream["response_format"] = response_format
    upstream.update(think_fields(think))
    return _finish("generate", CHAT_PATH, body, upstream, model, stream, think, is_load)


def with_default_think(request: UpstreamRequest, capabilities: Collection[str]) -> UpstreamRequest:
    """Ollama's thinking default: a request without ``think`` to a model with the ``thinking`` capability
    thinks (Ollama's ChatHandler/GenerateHandler turn thinking on then), so ``think`` becomes True and its
    llama-server fields are sent, whatever
    the template's own default. Raw ``/api/generate`` (no template) and load requests are left alone, as
    is a request that set ``think`` itself."""
    if request.think is not None or request.is_load or request.path != CHAT_PATH:
        return request
    if "thinking" not in capabilities:
        return request
    return replace(request, think=True, body={**request.body, **think_fields(True)})
