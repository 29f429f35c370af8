"""Forced tool use on ``/v1/messages``: ``tool_choice {type: tool, name}`` or ``{type: any}``.

Anthropic guarantees that such a request is answered with a ``tool_use`` block (``stop_reason:
"tool_use"``). llama-server's own ``/v1/messages`` falls short of that: its "required" tool grammar lets
the model write free text before a call, so a small model rambles until ``max_tokens`` and never calls
(and a template that cannot render tools ignores them altogether). So llmman translates a forcing request
itself, to llama-server's ``/v1/chat/completions`` with ``response_format: json_schema`` built from the
forced tool's ``input_schema`` (a grammar the output cannot leave), and turns the JSON the model writes
into the tool call:

- one forced tool: the schema is its ``input_schema``; the answer's text is the ``input``, streamed as
  ``input_json_delta`` events as it comes;
- ``any`` over several tools: the schema is ``anyOf`` ``{"name": const, "input": schema}`` per tool; the
  answer names the tool, so the stream sends the block whole once the model is done.

The conversation is converted to OpenAI messages (:func:`chat_messages`): text and image blocks become
parts, ``tool_use`` blocks assistant ``tool_calls``, ``tool_result`` blocks ``tool`` messages, ``thinking``
``reasoning_content``. The forced tools are described in the system prompt rather than sent as ``tools``:
with ``tools`` present llama-server builds its tool-call parser, which (b11434, a Qwen-style template)
takes the whole grammar-constrained answer for reasoning. Thinking is switched off (Anthropic refuses
thinking with a forced tool anyway).

Answers: ``msg_<id>`` / ``toolu_<id>`` from llama-server's ``chatcmpl-<id>``, ``stop_reason`` ``tool_use``
(``max_tokens`` when the output was cut, with whatever ``input`` could be read), usage as llama-server's
own Anthropic route reports it (``input_tokens`` without the cached part, ``cache_read_input_tokens``).
No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from llmman.protocol.anthropic.messages import anthropic_error
from llmman.protocol.framing import FrameError, SSEEvent, parse_data, sse

__all__ = ["ForcedToolStream", "chat_messages", "forced_message", "forced_request"]


def _text_of(content: object) -> str:
    """The text of a ``tool_result`` content: the string, or its text blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"]
        return "\n".join(texts)
    return ""


def _image_url(block: Mapping[str, object]) -> str | None:
    source = block.get("source")
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    url = source.get("url")
    return url if isinstance(url, str) else None


def _user(content: list[object]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    parts: list[dict[str, object]] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "tool_result":
            text = _text_of(block.get("content"))
            if block.get("is_error") is True:
                text = f"Error: {text}"
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id")), "content": text})
        elif kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            url = _image_url(block)
            if url:
                parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "document":
            source = block.get("source")
            if isinstance(source, dict) and source.get("type") == "text":
                parts.append({"type": "text", "text": str(source.get("data", ""))})
    if parts:
        if all(p["type"] == "text" for p in parts):
            out.append({"role": "user", "content": "\n".join(str(p["text"]) for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _assistant(content: list[object]) -> dict[str, object]:
    texts, thoughts, calls = [], [], []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            thoughts.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            calls.append({"id": str(block.get("id")), "type": "function",
                          "function": {"name": str(block.get("name")), "arguments": arguments}})
    msg: dict[str, object] = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    return msg


def chat_messages(body: Mapping[str, object]) -> list[dict[str, object]]:
    """OpenAI chat messages for a prepared Anthropic body (``system`` a string, no system turns)."""
    out: list[dict[str, object]] = []
    if isinstance(body.get("system"), str) and body["system"]:
        out.append({"role": "system", "content": body["system"]})
    messages = body.get("messages")
    for msg in messages if isinstance(messages, list) else []:
        if not isinstance(msg, dict):
            continue
        role, content = msg.get("role"), msg.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out.extend(_user(content) if role == "user" else [_assistant(content)])
    return out


def _schema(tools: list[dict[str, object]]) -> dict[str, object]:
    if len(tools) == 1:
        schema = tools[0].get("input_schema")
        return schema if isinstance(schema, dict) else {"type": "object"}
    return {"anyOf": [{
        "type": "object",
        "properties": {"name": {"const": t["name"]}, "input": t.get("input_schema") or {"type": "object"}},
        "required": ["name", "input"],
    } for t in tools]}


def _instruction(tools: list[dict[str, object]]) -> str:
    """The system-prompt lines that tell the model which tool it is calling."""
    if len(tools) == 1:
        return (f"Call the tool {tools[0]['name']}"
                + (f" ({tools[0]['description']})" if tools[0].get("description") else "")
                + ". Reply with its input as a JSON object.")
    lines = [f"- {t['name']}: {t['description']}" if t.get("description") else f"- {t['name']}"
             for t in tools]
    return ("Call one of these tools. Reply with a JSON object naming the tool and giving its input.\n"
            + "\n".join(lines))


def forced_request(body: Mapping[str, object], tools: list[dict[str, object]]) -> dict[str, object]:
    """The ``/v1/chat/completions`` body for a prepared Anthropic body that forces one of ``tools``."""
    name = str(tools[0]["name"]) if len(tools) == 1 else "tool_call"
    system = body.get("system")
    instruction = _instruction(tools)
    with_tools = {**body, "system": f"{system}\n\n{instruction}" if isinstance(system, str) and system
                  else instruction}
    out: dict[str, object] = {
        "messages": chat_messages(with_tools),
        "max_tokens": body.get("max_tokens"),
        "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": _schema(tools)}},
        "chat_template_kwargs": {"enable_thinking": False},
        "reasoning_effort": "none",
    }
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    if body.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _suffix(upstream_id: object) -> str:
    text = upstream_id if isinstance(upstream_id, str) and upstream_id else "local"
    return text.removeprefix("chatcmpl-")


def _usage(usage: object) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
    prompt = usage.get("prompt_tokens", 0)
    cached = cached if isinstance(cached, int) else 0
    prompt = prompt if isinstance(prompt, int) else 0
    output = usage.get("completion_tokens", 0)
    return {"cache_read_input_tokens": cached, "input_tokens": max(prompt - cached, 0),
            "output_tokens": output if isinstance(output, int) else 0}


def _call(text: str, tools: list[dict[str, object]]) -> tuple[str, dict[str, object]]:
    """``(tool name, input)`` from the model's JSON (``{}`` when it cannot be read, e.g. cut short)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = None
    if len(tools) == 1:
        return str(tools[0]["name"]), value if isinstance(value, dict) else {}
    if isinstance(value, dict) and isinstance(value.get("input"), dict):
        names = [str(t["name"]) for t in tools]
        name = value.get("name")
        return (str(name) if name in names else names[0]), value["input"]
    return str(tools[0]["name"]), {}


def _stop_reason(finish: object) -> str:
    return "max_tokens" if finish == "length" else "tool_use"


def forced_message(
    answer: Mapping[str, object], tools: list[dict[str, object]], model: str
) -> dict[str, object]:
    """The Anthropic message for a non-streamed ``/v1/chat/completions`` answer to :func:`forced_request`."""
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    assert isinstance(message, dict)
    text = message.get("content") if isinstance(message.get("content"), str) else ""
    name, tool_input = _call(str(text), tools)
    suffix = _suffix(answer.get("id"))
    return {
        "id": f"msg_{suffix}", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "tool_use", "id": f"toolu_{suffix}", "name": name, "input": tool_input}],
        "stop_reason": _stop_reason(choice.get("finish_reason")), "stop_sequence": None,
        "usage": _usage(answer.get("usage")),
    }


class ForcedToolStream:
    """Transducer from llama-server's OpenAI SSE stream (for :func:`forced_request`) to Anthropic's events:
    ``message_start``, ``ping``, ``content_block_start`` (tool_use), ``content_block_delta``
    (``input_json_delta``), ``content_block_stop``, ``message_delta`` (stop_reason, usage),
    ``message_stop``. ``feed(event) -> bytes`` per upstream event, then ``close() -> bytes``; a stream that
    ends before the model finished gets one ``error`` event instead of the closing events."""

    def __init__(self, model: str, tools: list[dict[str, object]]) -> None:
        self.model = model
        self.tools = tools
        self.started = False
        self.finish: object = None
        self.usage: object = None
        self.text: list[str] = []
        self.done = False
        self.failed = False
        self._suffix = "local"

    def _start(self, upstream_id: object) -> bytes:
        self.started = True
        self._suffix = _suffix(upstream_id)
        message: dict[str, object] = {
            "id": f"msg_{self._suffix}", "type": "message", "role": "assistant", "content": [],
            "model": self.model, "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        out = sse({"type": "message_start", "message": message}, event="message_start")
        out += sse({"type": "ping"}, event="ping")
        if len(self.tools) == 1:
            out += self._block_start(str(self.tools[0]["name"]))
        return out

    def _block_start(self, name: str) -> bytes:
        block = {"type": "tool_use", "id": f"toolu_{self._suffix}", "name": name, "input": {}}
        event = {"type": "content_block_start", "index": 0, "content_block": block}
        return sse(event, event="content_block_start")

    @staticmethod
    def _delta(partial: str) -> bytes:
        event = {"type": "content_block_delta", "index": 0,
                 "delta": {"type": "input_json_delta", "partial_json": partial}}
        return sse(event, event="content_block_delta")

    def feed(self, event: SSEEvent) -> bytes:
        """Encoded SSE bytes for one upstream event (``b""`` for nothing to send)."""
        if self.done or self.failed:
            return b""
        try:
            chunk = parse_data(event)
        except FrameError:
            return b""
        if chunk is None:  # [DONE]
            return self._finish()
        if "error" in chunk:
            err = chunk["error"]
            text = err.get("message") if isinstance(err, dict) else err
            return self.error(str(text or "llama-server reported an error"))
        out = b"" if self.started else self._start(chunk.get("id"))
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            assert isinstance(delta, dict)
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                self.text.append(piece)
                if len(self.tools) == 1:
                    out += self._delta(piece)
            if choice.get("finish_reason") is not None:
                self.finish = choice["finish_reason"]
        return out

    def _finish(self) -> bytes:
        self.done = True
        out = b"" if self.started else self._start(None)
        if len(self.tools) > 1:
            name, tool_input = _call("".join(self.text), self.tools)
            out += self._block_start(name) + self._delta(orjson.dumps(tool_input).decode())
        out += sse({"type": "content_block_stop", "index": 0}, event="content_block_stop")
        usage = _usage(self.usage)
        stop = {"stop_reason": _stop_reason(self.finish), "stop_sequence": None}
        delta = {"type": "message_delta", "delta": stop, "usage": usage}
        out += sse(delta, event="message_delta")
        return out + sse({"type": "message_stop"}, event="message_stop")

    def error(self, message: str, status: int = 500) -> bytes:
        """An in-band ``error`` event (the stream is over after it)."""
        self.failed = True
        return sse(anthropic_error(message, status=status), event="error")

    def close(self) -> bytes:
        """End of the upstream stream: the closing events if the model had finished (``[DONE]`` may be
        missing), else an ``error`` event."""
        if self.done or self.failed:
            return b""
        if self.finish is not None:
            return self._finish()
        return self.error("the model's answer ended before it finished")
