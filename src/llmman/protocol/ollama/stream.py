"""llama-server streaming chunks -> Ollama NDJSON objects (a pure stream transducer).

Fixes the old llmman's stream bugs: no object for an empty delta (the
role-only first chunk, the finish chunk, the usage chunk), exactly ONE ``done: true`` object (from
:meth:`OllamaStream.final`, never from ``[DONE]`` or ``finish_reason``), a real ``done_reason``
(``length`` when llama-server says so), the six metrics, and ``stream:false`` through :meth:`aggregate`.
Tool calls come out with an id and their ``arguments`` as an object, whether llama-server streamed them as
OpenAI's JSON string (in pieces) or, as some builds do, as a JSON object.
Shapes: Ollama's ``api.ChatResponse``/``api.GenerateResponse`` (``api/types.go``) out of llama-server's
``/v1/chat/completions`` and ``/v1/completions`` SSE chunks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import orjson

from llmman.errors import RunnerError

__all__ = ["OllamaStream", "error_line", "load_response"]

Kind = Literal["chat", "generate"]
_METRICS = (
    "total_duration load_duration prompt_eval_count prompt_eval_duration eval_count eval_duration".split()
)


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _error_message(err: object) -> tuple[str, int | None]:
    if isinstance(err, dict):
        code = err.get("code")
        status = code if isinstance(code, int) and 400 <= code <= 599 else None
        return str(err.get("message") or "llama-server error"), status
    return str(err), None


def _arguments(raw: str) -> dict[str, object]:
    """Parse OpenAI's JSON-string ``arguments`` into Ollama's object. Empty -> ``{}``; text that is not a JSON
    object is kept, unparsed, as ``{"_raw": text}`` so nothing the model produced is lost."""
    if not raw.strip():
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_raw": raw}


def _logprobs(value: object) -> list[dict[str, object]]:
    """llama-server ``logprobs.content[]`` -> Ollama ``logprobs[]`` ({token, logprob, top_logprobs?})."""
    content = value.get("content") if isinstance(value, dict) else None
    out: list[dict[str, object]] = []
    for item in content if isinstance(content, list) else []:
        if not isinstance(item, dict):
            continue
        entry: dict[str, object] = {
            "token": _text(item.get("token")),
            "logprob": _num(item.get("logprob")) or 0.0,
        }
        top = item.get("top_logprobs")
        if isinstance(top, list):
            entry["top_logprobs"] = [
                {"token": _text(t.get("token")), "logprob": _num(t.get("logprob")) or 0.0}
                for t in top
                if isinstance(t, dict)
            ]
        out.append(entry)
    return out


class OllamaStream:
    """Feed parsed upstream SSE chunks in, get Ollama objects out; then ``final()`` (and ``aggregate()``).

    ``created_at`` returns an RFC 3339 UTC timestamp ending in ``Z`` (injected: no clock here).
    ``new_call_id`` makes tool-call ids; by default they are ``call_`` + 8 hex digits derived from the
    upstream id (Ollama's ``call_`` + 8 lowercase alphanumerics shape), deterministic for tests.
    """

    def __init__(
        self,
        kind: Kind,
        model: str,
        created_at: Callable[[], str],
        new_call_id: Callable[[], str] | None = None,
    ) -> None:
        self.kind = kind
        self.model = model
        self._created_at = created_at
        self._new_call_id = new_call_id
        self._content: list[str] = []
        self._thinking: list[str] = []
        self._logprobs: list[dict[str, object]] = []
        self._calls: list[dict[str, object]] = []
        self._pending: dict[int, _PendingCall] = {}
        self._finish_reason: str | None = None
        self._usage: dict[str, object] = {}
        self._timings: dict[str, object] = {}
        self._final: dict[str, object] | None = None

    def feed(self, chunk: dict[str, object]) -> list[dict[str, object]]:
        """Translate one upstream chunk (the JSON of a ``data:`` payload; the caller drops ``[DONE]``).

        Returns 0..2 Ollama objects with ``done: false``: one for non-empty content/thinking/logprobs, one
        with all tool calls (content ``""``) when the chunk carries ``finish_reason``. ``usage`` and
        ``timings`` are remembered from whichever chunk carries them.

        Raises:
            RunnerError: the chunk is llama-server's in-stream ``{"error": {...}}`` (status from its code).
        """
        if self._final is not None:
            raise RuntimeError("feed() after final()")
        if chunk.get("error") is not None:
            message, status = _error_message(chunk["error"])
            raise RunnerError(message, status=status)
        if isinstance(usage := chunk.get("usage"), dict):
            self._usage = usage
        if isinstance(timings := chunk.get("timings"), dict):
            self._timings = timings
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return []
        choice: dict[str, object] = choices[0]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = _text(delta.get("content"))
            thinking = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
            tool_deltas = delta.get("tool_calls")
            for td in tool_deltas if isinstance(tool_deltas, list) else []:
                if isinstance(td, dict):
                    self._accumulate(td)
        else:  # /v1/completions (raw generate)
            text, thinking = _text(choice.get("text")), ""
        logprobs = _logprobs(choice.get("logprobs"))
        out: list[dict[str, object]] = []
        if text or thinking or logprobs:
            self._content.append(text)
            self._thinking.append(thinking)
            self._logprobs += logprobs
            out.append(self._object(text, thinking, [], logprobs, done=False))
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            self._finish_reason = finish
            if calls := self._flush_calls():
                out.append(self._object("", "", calls, [], done=False))
        return out

    def final(self, *, total_duration_ns: int, load_duration_ns: int) -> dict[str, object]:
        """The one ``done: true`` object: ``done_reason`` (``length`` iff finish_reason was ``length``, else
        ``stop``; Ollama keeps ``stop`` after tool calls) and the metrics, integers in nanoseconds/counts:
        total_duration, load_duration (passed in); prompt_eval_count (usage.prompt_tokens, else timings
        prompt_n + cache_n); prompt_eval_duration (timings.prompt_ms * 1e6); eval_count (timings.predicted_n,
        else usage.completion_tokens); eval_duration (timings.predicted_ms * 1e6). Zero metrics are omitted,
        as Ollama's ``omitempty`` does. Tool calls never closed by a finish chunk ride on this object.

        Raises:
            RuntimeError: called twice (there must be exactly one done line).
        """
        if self._final is not None:
            raise RuntimeError("final() called twice")
        obj = self._object("", "", self._flush_calls(), [], done=True)
        obj["done_reason"] = "length" if self._finish_reason == "length" else "stop"
        metrics = self._metrics(total_duration_ns, load_duration_ns)
        obj.update({k: metrics[k] for k in _METRICS if metrics[k]})
        self._final = obj
        return obj

    def aggregate(self) -> dict[str, object]:
        """The ``stream:false`` answer (call after :meth:`final`): the final object with the concatenated
        content (``message.content`` / ``response``), thinking, all tool calls and logprobs."""
        if self._final is None:
            raise RuntimeError("aggregate() before final()")
        obj = self._object(
            "".join(self._content), "".join(self._thinking), self._calls, self._logprobs, done=True
        )
        obj["created_at"] = self._final["created_at"]
        obj.update({k: v for k, v in self._final.items() if k not in obj})
        return obj

    def single(self, *, total_duration_ns: int, load_duration_ns: int) -> dict[str, object]:
        """:meth:`final` then :meth:`aggregate`: the whole ``stream:false`` answer in one call."""
        self.final(total_duration_ns=total_duration_ns, load_duration_ns=load_duration_ns)
        return self.aggregate()

    def _object(
        self,
        text: str,
        thinking: str,
        calls: list[dict[str, object]],
        logprobs: list[dict[str, object]],
        *,
        done: bool,
    ) -> dict[str, object]:
        obj: dict[str, object] = {"model": self.model, "created_at": self._created_at()}
        extra: dict[str, object] = {}
        if thinking:
            extra["thinking"] = thinking
        if calls:
            extra["tool_calls"] = list(calls)
        if self.kind == "chat":
            obj["message"] = {"role": "assistant", "content": text, **extra}
        else:
            obj.update({"response": text, **extra})
        obj["done"] = done
        if logprobs:
            obj["logprobs"] = list(logprobs)
        return obj

    def _accumulate(self, td: dict[str, object]) -> None:
        index = td.get("index")
        if not isinstance(index, int):  # no index: a new id starts a call, fragments extend the last one
            index = (
                max(self._pending, default=-1) + 1
                if td.get("id") or not self._pending
                else max(self._pending)
            )
        call = self._pending.setdefault(index, _PendingCall())
        if not call.id:
            call.id = _text(td.get("id"))
        fn = td.get("function")
        if isinstance(fn, dict):
            call.name += _text(fn.get("name"))
            args = fn.get("arguments")
            # a JSON object (some llama-server builds) is kept whole, never read as "" (arguments lost)
            call.arguments.append(orjson.dumps(args).decode() if isinstance(args, dict) else _text(args))

    def _flush_calls(self) -> list[dict[str, object]]:
        calls: list[dict[str, object]] = []
        for n, call in enumerate((self._pending[i] for i in sorted(self._pending)), start=len(self._calls)):
            arguments = _arguments("".join(call.arguments))
            function = {"index": n, "name": call.name, "arguments": arguments}
            calls.append({"id": self._call_id(call.id, n), "function": function})
        self._pending.clear()
        self._calls += calls
        return calls

    def _call_id(self, upstream: str, n: int) -> str:
        if self._new_call_id is not None:
            return self._new_call_id()
        seed = upstream or f"{self.model}\0{self._created_at()}\0{n}"
        return "call_" + hashlib.sha256(seed.encode()).hexdigest()[:8]

    def _metrics(self, total_ns: int, load_ns: int) -> dict[str, int]:
        t, u = self._timings, self._usage
        prompt_n = _num(u.get("prompt_tokens"))
        if prompt_n is None and _num(t.get("prompt_n")) is not None:
            prompt_n = (_num(t.get("prompt_n")) or 0) + (_num(t.get("cache_n")) or 0)
        eval_n = _num(t.get("predicted_n"))
        if eval_n is None:
            eval_n = _num(u.get("completion_tokens"))
        return {
            "total_duration": int(total_ns),
            "load_duration": int(load_ns),
            "prompt_eval_count": int(prompt_n or 0),
            "prompt_eval_duration": round((_num(t.get("prompt_ms")) or 0) * 1e6),
            "eval_count": int(eval_n or 0),
            "eval_duration": round((_num(t.get("predicted_ms")) or 0) * 1e6),
        }


def load_response(
    kind: Kind, model: str, created_at: str, done_reason: Literal["load", "unload"]
) -> dict[str, object]:
    """The one-object answer to an empty-prompt / empty-messages request (Ollama's load/unload).

    ``created_at`` is the RFC 3339 UTC timestamp string; chat carries ``message {role: assistant,
    content: ""}`` (the Python client requires ``message``), generate carries ``response: ""``.
    """
    obj: dict[str, object] = {"model": model, "created_at": created_at}
    if kind == "chat":
        obj["message"] = {"role": "assistant", "content": ""}
    else:
        obj["response"] = ""
    obj.update({"done": True, "done_reason": done_reason})
    return obj


def error_line(message: str) -> dict[str, object]:
    """Ollama's error object ``{"error": message}``: the body before streaming, an in-band line after it."""
    return {"error": message}
