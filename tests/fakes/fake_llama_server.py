#!/usr/bin/env python3
"""A small fake llama-server for timing and fault-injection tests (standard library only).

Run it like the real one: ``python fake_llama_server.py -m MODEL --host H --port P [-a ALIAS] [-c N]
[-np N] [--metrics] [other llama-server flags, ignored]``. ``--port 0`` binds a free port; the port is
printed in the ``HTTP server is listening`` line right after binding. It binds first, answers every
route 503 ``Loading model`` while "loading", then serves. Logs go to stderr in llama-server's style
(``srv  load_model: ...``, ``main: model loaded``, ``srv  llama_server: listening on http://H:P``);
``/health`` polls are not logged (so they never reset a caller's stall timer).

Environment variables:
    FAKE_LOAD_DELAY=S          seconds of "loading" (``/health`` 503) before ready; default 0. A line is
                               printed every FAKE_LOAD_LOG_INTERVAL seconds (default 0.1) meanwhile.
    FAKE_LOAD_GATE=PATH        also stay "loading" until PATH exists (checked, with a progress line, every
                               FAKE_LOAD_LOG_INTERVAL seconds): a test decides when the load finishes.
    FAKE_EXIT_ON_LOAD=N        print a few load-error lines and exit with code N while loading.
    FAKE_OOM_ABOVE_CTX=N       a per-slot context above N tokens fails the load as llama.cpp does when the KV
                               cache does not fit (``ggml_aligned_malloc: insufficient memory ...``, exit 1).
    FAKE_SILENT_HANG=1         print nothing at all and never become ready (stall-timeout tests).
    FAKE_CRASH_AFTER_TOKENS=N  SIGKILL itself after sending N generated tokens in one response.
    FAKE_CRASH_ON=TEXT         SIGKILL itself on receiving a POST whose body contains TEXT, before any byte
                               of the answer (a poison request, as a grammar llama-server cannot parse).
    FAKE_HEALTH_MUTE=1         leave ``/health`` unanswered while any generation runs (as llama-server
                               under many streams, its HTTP threads all busy), answering once none does.
    FAKE_IGNORE_SIGTERM=1      ignore SIGTERM (only SIGKILL stops it). Otherwise SIGTERM exits 0.
    FAKE_TOKEN_DELAY=S         seconds between generated tokens; default 0.
    FAKE_SLOTS=1               at most ``-np`` generations at once, as llama-server's slots: the others
                               wait for one (fixed capacity, with FAKE_TOKEN_DELAY). Default: no limit.
    FAKE_REPLY=TEXT            the answer; default "Hello from the fake llama-server.". Tokens are its
                               words (each with its leading space). JSON is written as raw UTF-8, as
                               llama-server does (no ``\\uXXXX`` escapes).
    FAKE_SPLIT_BYTES=1         write every SSE event as two HTTP chunks with a short pause between, cut
                               inside the first multi-byte UTF-8 character (or mid-event if none), so a
                               client sees a character split across network reads.
    FAKE_TOOL_CALL=JSON        ``{"name": ..., "arguments": {...}}``: a chat (or Responses) request with tools
                               and whose last message is not a ``tool`` result is answered with this one
                               tool call (id ``call_fake0001``, ``finish_reason: "tool_calls"``); streamed,
                               its ``arguments`` string is spread over three chunks as llama-server does.
                               A request whose last message is a tool result gets FAKE_REPLY.
    FAKE_DROP_FIRST_EVENT=1    leave out the first event of every stream, as llama-server b11434 sometimes
                               does under CPU load: a chat stream without its ``delta.role`` chunk, a
                               ``/v1/messages`` stream without ``message_start``, a ``/v1/responses`` stream
                               without ``response.created``.
    FAKE_TOOL_ARGS_OBJECT=1    FAKE_TOOL_CALL's ``function.arguments`` as a JSON object instead of a string
                               (some llama-server builds), streamed in one chunk; on ``/v1/responses`` (a
                               request with ``tools``) the ``function_call`` item's ``arguments``.
    FAKE_CREATED_STEP=1        every chunk of a stream carries a ``created`` one second later than the one
                               before (llama-server stamps each chunk with the time it was made).
    FAKE_PER_MODEL=JSON        per-model overrides of these variables, ``{"KEY": {"FAKE_X": "v"}}``: an
                               entry applies when KEY equals the ``-a`` alias or the ``-m`` path, or is a
                               substring of the alias (one fake binary can then play a slow model A and
                               a fast model B in one daemon).

Endpoints: ``GET /health``, ``/v1/health``, ``/props``, ``/v1/models`` (= ``/models``), ``/metrics``
(with ``--metrics``), ``POST /v1/chat/completions`` (= ``/chat/completions``) and ``/v1/completions``,
``/v1/messages`` and ``/v1/responses`` (their events shaped like llama-server's own, streamed or not),
``/v1/messages/count_tokens`` (``{"input_tokens"}``, the words of the messages),
streaming (SSE shaped like llama-server: role chunk, one chunk per token, a finish chunk, a usage chunk
when ``stream_options.include_usage``, ``timings`` on the last, then ``data: [DONE]``) or not;
``max_tokens`` / ``max_completion_tokens`` / ``n_predict`` truncate with ``finish_reason: "length"``.
Test-only: ``GET /fake/env`` (the process environment as JSON, per-model overrides applied),
``GET /fake/argv`` and ``GET /fake/stats`` (``{"active", "started", "completed", "disconnected",
"requests"}``: generations, streaming or not, now running, begun, finished, and abandoned because the
client went away, noticed at the next token as llama-server does); these answer while loading too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# Behaviour knobs, read from the environment by configure() once the alias is known (FAKE_PER_MODEL).
SILENT = False
REPLY = "Hello from the fake llama-server."
TOKEN_DELAY = 0.0
CRASH_AFTER = -1
SPLIT_BYTES = False
TOOL_CALL: dict[str, Any] | None = None
DROP_FIRST = False
ARGS_OBJECT = False
CREATED_STEP = False
SPLIT_PAUSE = 0.005  # seconds between the two halves of a split event (lets the reader see them apart)
LOADING_BODY = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


def log(text: str) -> None:
    if not SILENT:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def apply_per_model(alias: str, model: str) -> None:
    """Overlay the ``FAKE_PER_MODEL`` entries matching this child onto ``os.environ``."""
    raw = os.environ.get("FAKE_PER_MODEL")
    if not raw:
        return
    for key, values in json.loads(raw).items():
        if key in (alias, model) or (key and key in alias):
            os.environ.update({str(k): str(v) for k, v in values.items()})


def configure() -> None:
    """Read the behaviour knobs from the (overlaid) environment."""
    global SILENT, REPLY, TOKEN_DELAY, CRASH_AFTER, SPLIT_BYTES, TOOL_CALL
    global DROP_FIRST, ARGS_OBJECT, CREATED_STEP
    SILENT = os.environ.get("FAKE_SILENT_HANG") == "1"
    REPLY = os.environ.get("FAKE_REPLY", "Hello from the fake llama-server.")
    TOKEN_DELAY = float(os.environ.get("FAKE_TOKEN_DELAY", "0"))
    CRASH_AFTER = int(os.environ.get("FAKE_CRASH_AFTER_TOKENS", "-1"))
    SPLIT_BYTES = os.environ.get("FAKE_SPLIT_BYTES") == "1"
    TOOL_CALL = json.loads(os.environ["FAKE_TOOL_CALL"]) if os.environ.get("FAKE_TOOL_CALL") else None
    DROP_FIRST = os.environ.get("FAKE_DROP_FIRST_EVENT") == "1"
    ARGS_OBJECT = os.environ.get("FAKE_TOOL_ARGS_OBJECT") == "1"
    CREATED_STEP = os.environ.get("FAKE_CREATED_STEP") == "1"


def dumps(obj: Any) -> bytes:
    """JSON as llama-server writes it: compact-ish, non-ASCII as raw UTF-8."""
    return json.dumps(obj, ensure_ascii=False).encode()


def split_point(payload: bytes) -> int:
    """Where to cut ``payload`` in two: just after the lead byte of its first multi-byte character."""
    for i, byte in enumerate(payload):
        if byte >= 0xC0:
            return i + 1
    return max(1, len(payload) // 2)


def make_launcher(directory: Path, python: str = sys.executable) -> Path:
    """Write ``directory/llama-server``, a shell script that execs this fake (same pid), and return it."""
    path = directory / "llama-server"
    path.write_text(f'#!/bin/sh\nexec "{python}" "{Path(__file__).resolve()}" "$@"\n')
    path.chmod(0o755)
    return path


class Settings:
    def __init__(self, argv: list[str]) -> None:
        def opt(*names: str, default: str) -> str:
            for i, arg in enumerate(argv[:-1]):
                if arg in names:
                    return argv[i + 1]
            return default

        self.argv = argv
        self.model = opt("-m", "--model", default="model.gguf")
        self.alias = opt("-a", "--alias", default="")
        self.host = opt("--host", default="127.0.0.1")
        self.port = int(opt("--port", default="8080"))
        n_ctx = int(opt("-c", "--ctx-size", default="4096"))
        np_given = any(a in ("-np", "--parallel") for a in argv)
        self.slots = int(opt("-np", "--parallel", default="4"))
        self.unified = not np_given or any(a in ("-kvu", "--kv-unified") for a in argv)
        self.n_ctx_slot = n_ctx if self.unified else n_ctx // self.slots
        self.metrics = "--metrics" in argv
        self.model_id = self.alias.split(",")[0] if self.alias else self.model


class State:
    ready = threading.Event()
    slots: Any = contextlib.nullcontext()  # a semaphore of -np slots with FAKE_SLOTS=1
    requests = 0
    started = 0
    active = 0
    completed = 0
    disconnected = 0
    lock = threading.Lock()

    @classmethod
    def stats(cls) -> dict[str, int]:
        with cls.lock:
            return {"active": cls.active, "started": cls.started, "completed": cls.completed,
                    "disconnected": cls.disconnected, "requests": cls.requests}  # fmt: skip

    @classmethod
    def begin(cls) -> None:
        with cls.lock:
            cls.started += 1
            cls.active += 1

    @classmethod
    def end(cls, completed: bool) -> None:
        with cls.lock:
            cls.active -= 1
            if completed:
                cls.completed += 1
            else:
                cls.disconnected += 1


def tokens_of(text: str) -> list[str]:
    return re.findall(r"\s*\S+", text)


def count_prompt(body: dict[str, Any]) -> int:
    if isinstance(body.get("messages"), list):
        parts = [m.get("content") for m in body["messages"] if isinstance(m, dict)]
        text = " ".join(p if isinstance(p, str) else json.dumps(p) for p in parts if p is not None)
    else:
        text = str(body.get("prompt", ""))
    return max(1, len(tokens_of(text)))


def invalid_field(body: dict[str, Any], chat: bool) -> str | None:
    """What llama-server would reject with a 400 before generating (the fields the fake reads)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return "'messages' is required"
        if not all(isinstance(m, dict) for m in messages):
            return "'messages' must be an array of objects"
    elif not isinstance(body.get("prompt", ""), str | list):
        return "\"prompt\" must be a string or an array"
    if not isinstance(body.get("stream_options") or {}, dict):
        return "\"stream_options\" must be an object"
    return None


def timings(prompt_n: int, predicted_n: int) -> dict[str, Any]:
    return {
        "cache_n": 0, "prompt_n": prompt_n, "prompt_ms": 1.0 * prompt_n, "prompt_per_token_ms": 1.0,
        "prompt_per_second": 1000.0, "predicted_n": predicted_n, "predicted_ms": 2.0 * predicted_n,
        "predicted_per_token_ms": 2.0, "predicted_per_second": 500.0,
    }  # fmt: skip


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "llama.cpp"
    sys_version = ""
    disable_nagle_algorithm = True  # small SSE writes go out at once, as llama-server's do
    settings: Settings

    def log_message(self, format: str, *args: Any) -> None:
        pass  # request lines are logged by handle_* in llama-server's style instead

    # ------------------------------------------------------------------------------------- helpers
    def send_json(self, status: int, obj: Any, content_type: str = "application/json") -> None:
        data = obj.encode() if isinstance(obj, str) else dumps(obj)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if not self.path.endswith("health"):
            log(f"srv  log_server_r: request: {self.command} {self.path} 127.0.0.1 {status}")

    def send_error_json(self, status: int, message: str, kind: str) -> None:
        self.send_json(status, {"error": {"code": status, "message": message, "type": kind}})

    def chunk(self, obj: Any, event: str | None = None) -> None:
        if CREATED_STEP and isinstance(obj, dict) and "created" in obj:
            self._step = getattr(self, "_step", -1) + 1
            obj = {**obj, "created": obj["created"] + self._step}
        head = b"event: " + event.encode() + b"\n" if event else b""
        payload = head + b"data: " + (obj if isinstance(obj, bytes) else dumps(obj)) + b"\n\n"
        parts = [payload]
        if SPLIT_BYTES and len(payload) > 1:
            cut = split_point(payload)
            parts = [payload[:cut], payload[cut:]]
        for n, part in enumerate(parts):
            if n:
                time.sleep(SPLIT_PAUSE)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.flush()

    # -------------------------------------------------------------------------------------- routes
    def do_GET(self) -> None:
        s = self.settings
        path = self.path.split("?")[0]
        if path == "/fake/env":
            return self.send_json(200, dict(os.environ))
        if path == "/fake/argv":
            return self.send_json(200, s.argv)
        if path == "/fake/stats":
            return self.send_json(200, State.stats())
        if not State.ready.is_set():
            return self.send_json(503, LOADING_BODY)
        if path in ("/health", "/v1/health"):
            while os.environ.get("FAKE_HEALTH_MUTE") == "1" and State.stats()["active"]:
                time.sleep(0.01)
            return self.send_json(200, {"status": "ok"})
        if path == "/props":
            return self.send_json(200, {
                "default_generation_settings": {"n_ctx": s.n_ctx_slot, "params": {}},
                "total_slots": s.slots, "model_alias": s.model_id, "model_path": s.model,
                "build_info": "b0-fake", "is_sleeping": False,
                "modalities": {"vision": False, "audio": False, "video": False},
            })  # fmt: skip
        if path in ("/v1/models", "/models"):
            meta = {"n_ctx": s.n_ctx_slot, "n_ctx_train": 8192, "n_params": 1000, "size": 1000}
            entry = {"id": s.model_id, "object": "model", "created": int(time.time()),
                     "owned_by": "llamacpp", "aliases": [s.model_id], "meta": meta}  # fmt: skip
            return self.send_json(200, {"object": "list", "data": [entry]})
        if path == "/metrics" and s.metrics:
            text = f"llamacpp:requests_processing 0\nllamacpp:n_decode_total {State.requests}\n"
            return self.send_json(200, text, "text/plain; version=0.0.4")
        return self.send_error_json(404, "File Not Found", "not_found_error")

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not State.ready.is_set():
            return self.send_json(503, LOADING_BODY)
        poison = os.environ.get("FAKE_CRASH_ON")
        if poison and poison.encode() in raw:
            log(f"srv  fake: crashing on a request containing {poison!r} (FAKE_CRASH_ON)")
            os.kill(os.getpid(), signal.SIGKILL)
        chat = path in ("/v1/chat/completions", "/chat/completions")
        native = path in ("/v1/messages", "/v1/responses")
        counting = path == "/v1/messages/count_tokens"
        if not chat and not native and not counting and path != "/v1/completions":
            return self.send_error_json(404, "File Not Found", "not_found_error")
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("request body must be a JSON object")
        except ValueError as exc:
            return self.send_error_json(400, f"Failed to parse JSON: {exc}", "invalid_request_error")
        if counting:
            return self.send_json(200, {"input_tokens": count_prompt(body)})
        problem = None if native else invalid_field(body, chat)
        if problem:
            return self.send_error_json(400, problem, "invalid_request_error")
        with State.lock:
            State.requests += 1
        try:
            with State.slots:
                if native:
                    self.native(body, path)
                else:
                    self.complete(body, chat)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            # llama-server answers a field of the wrong shape with 400 (its JSON type errors are
            # invalid_argument); the fake must not just drop the connection. Only before any byte.
            if not getattr(self, "_headers_buffer", None) and not self.wfile.closed:
                try:
                    self.send_error_json(400, f"invalid request: {exc}", "invalid_request_error")
                except OSError:
                    pass

    def wants_tool_call(self, body: dict[str, Any], chat: bool) -> bool:
        messages = body.get("messages") or [{}]
        last = messages[-1] if isinstance(messages[-1], dict) else {}
        return chat and TOOL_CALL is not None and bool(body.get("tools")) and last.get("role") != "tool"

    def tool_call(self, base: dict[str, Any], body: dict[str, Any]) -> None:
        """Answer with FAKE_TOOL_CALL: one message, or a stream with the arguments in three pieces."""
        assert TOOL_CALL is not None
        args: Any = json.dumps(TOOL_CALL.get("arguments", {}))
        if ARGS_OBJECT:
            args = TOOL_CALL.get("arguments", {})
        call = {"id": "call_fake0001", "type": "function",
                "function": {"name": TOOL_CALL["name"], "arguments": args}}  # fmt: skip
        prompt_n = count_prompt(body)
        usage = {"completion_tokens": 3, "prompt_tokens": prompt_n, "total_tokens": prompt_n + 3}
        if not body.get("stream"):
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            choice = {"index": 0, "finish_reason": "tool_calls", "message": message}
            return self.send_json(200, {**base, "object": "chat.completion", "choices": [choice],
                                        "usage": usage, "timings": timings(prompt_n, 3)})  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        obj = {**base, "object": "chat.completion.chunk"}
        third = max(1, len(args) // 3)
        pieces = [args] if ARGS_OBJECT else [args[:third], args[third : 2 * third], args[2 * third :]]
        head = {"index": 0, "id": call["id"], "type": "function",
                "function": {"name": TOOL_CALL["name"], "arguments": ""}}  # fmt: skip
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": None}, {"tool_calls": [head]}]
        deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in pieces]
        if DROP_FIRST:
            deltas = deltas[1:]
        for delta in deltas:
            self.chunk({**obj, "choices": [{"index": 0, "finish_reason": None, "delta": delta}]})
        self.chunk({**obj, "choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {}}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            self.chunk({**obj, "choices": [], "usage": usage, "timings": timings(prompt_n, 3)})
        self.chunk(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def native(self, body: dict[str, Any], path: str) -> None:
        """llama-server's own ``/v1/messages`` or ``/v1/responses``: FAKE_REPLY, in their event shapes."""
        tokens = tokens_of(REPLY)
        limit = body.get("max_tokens", body.get("max_output_tokens"))
        if isinstance(limit, int) and 0 <= limit < len(tokens):
            tokens = tokens[:limit]
        prompt_n, text, key = count_prompt(body), "".join(tokens), uuid.uuid4().hex[:24]
        model, now = self.settings.model_id, int(time.time())
        usage = {"input_tokens": prompt_n, "output_tokens": len(tokens)}
        if path == "/v1/messages":
            message = {"id": f"chatcmpl-{key}", "type": "message", "role": "assistant", "model": model,
                       "stop_reason": None, "stop_sequence": None}  # fmt: skip
            whole = {**message, "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                     "usage": usage}  # fmt: skip
            events: list[tuple[str, Any]] = [
                ("message_start", {"type": "message_start", "message": {
                    **message, "content": [], "usage": {"input_tokens": prompt_n, "output_tokens": 0}}}),
                ("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}}),
                *[("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "text_delta", "text": t}}) for t in tokens],
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                   "stop_sequence": None}, "usage": {"output_tokens": len(tokens)}}),
                ("message_stop", {"type": "message_stop"}),
            ]  # fmt: skip
        else:
            item = f"msg_{key}"
            head = {"id": f"resp_{key}", "object": "response", "status": "in_progress"}
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
            done = {"type": "message", "status": "completed", "id": item, "content": [part],
                    "role": "assistant"}  # fmt: skip
            whole = {**head, "created_at": now, "status": "completed", "model": model, "output": [done],
                     "usage": {**usage, "total_tokens": prompt_n + len(tokens)}}  # fmt: skip
            events = [
                ("response.created", {"type": "response.created", "response": head}),
                ("response.in_progress", {"type": "response.in_progress", "response": head}),
                ("response.output_item.added", {"type": "response.output_item.added", "item": {
                    "content": [], "id": item, "role": "assistant", "status": "in_progress",
                    "type": "message"}}),
                ("response.content_part.added", {"type": "response.content_part.added", "item_id": item,
                                                 "part": {"type": "output_text", "text": ""}}),
                *[("response.output_text.delta", {"type": "response.output_text.delta", "item_id": item,
                                                  "delta": t}) for t in tokens],
                ("response.output_text.done", {"type": "response.output_text.done", "item_id": item,
                                               "text": text}),
                ("response.content_part.done", {"type": "response.content_part.done", "item_id": item,
                                                "part": part}),
                ("response.output_item.done", {"type": "response.output_item.done", "item": done}),
                ("response.completed", {"type": "response.completed", "response": whole}),
            ]  # fmt: skip
            items = body.get("input") if isinstance(body.get("input"), list) else [{}]
            last = items[-1] if items and isinstance(items[-1], dict) else {}
            if TOOL_CALL is not None and body.get("tools") and last.get("type") != "function_call_output":
                args = TOOL_CALL.get("arguments", {})
                text_args = json.dumps(args)
                call = {"type": "function_call", "id": f"fc_{key}", "call_id": "call_fake0001",
                        "name": TOOL_CALL["name"], "status": "completed",
                        "arguments": args if ARGS_OBJECT else text_args}  # fmt: skip
                whole = {**whole, "output": [call]}
                added = {**call, "arguments": "", "status": "in_progress"}
                events = [*events[:2],
                          ("response.output_item.added", {"type": "response.output_item.added",
                                                          "item": added}),
                          ("response.function_call_arguments.delta", {
                              "type": "response.function_call_arguments.delta", "item_id": call["id"],
                              "delta": text_args}),
                          ("response.function_call_arguments.done", {
                              "type": "response.function_call_arguments.done", "item_id": call["id"],
                              "arguments": call["arguments"]}),
                          ("response.output_item.done", {"type": "response.output_item.done", "item": call}),
                          ("response.completed", {"type": "response.completed",
                                                  "response": whole})]  # fmt: skip
        if not body.get("stream"):
            return self.send_json(200, whole)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        State.begin()
        completed = False
        try:
            for n, (name, data) in enumerate(events[1:] if DROP_FIRST else events):
                self.chunk(data, event=name)
                if n and name.endswith("delta") and name != "message_delta":
                    self.pace(n)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            completed = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            State.end(completed)

    def complete(self, body: dict[str, Any], chat: bool) -> None:
        if self.wants_tool_call(body, chat):
            base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                    "model": self.settings.model_id, "system_fingerprint": "b0-fake"}  # fmt: skip
            return self.tool_call(base, body)
        tokens = tokens_of(REPLY)
        limit = body.get("max_completion_tokens", body.get("max_tokens", body.get("n_predict")))
        finish = "stop"
        if isinstance(limit, int) and 0 <= limit < len(tokens):
            tokens, finish = tokens[:limit], "length"
        prompt_n = count_prompt(body)
        usage = {"completion_tokens": len(tokens), "prompt_tokens": prompt_n,
                 "total_tokens": prompt_n + len(tokens),
                 "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}" if chat else f"cmpl-{uuid.uuid4().hex[:24]}",
                "created": int(time.time()), "model": self.settings.model_id,
                "system_fingerprint": "b0-fake"}  # fmt: skip
        if not body.get("stream"):
            State.begin()
            try:
                for n in range(1, len(tokens) + 1):
                    self.pace(n)
                    if self.client_gone():
                        raise ConnectionResetError("client went away")
            except ConnectionResetError:
                log("srv          stop: client disconnected, cancelling task")
                self.close_connection = True
                State.end(completed=False)
                return
            State.end(completed=True)
            text = "".join(tokens)
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            obj = "chat.completion" if chat else "text_completion"
            answer = {**base, "object": obj, "choices": [choice], "usage": usage}
            return self.send_json(200, {**answer, "timings": timings(prompt_n, len(tokens))})
        self.stream(base, tokens, finish, usage, prompt_n, chat, body)

    def stream(self, base: dict[str, Any], tokens: list[str], finish: str, usage: dict[str, Any],
               prompt_n: int, chat: bool, body: dict[str, Any]) -> None:  # fmt: skip
        self.send_response(200)
        for name, value in (("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"),
                            ("X-Accel-Buffering", "no"), ("Transfer-Encoding", "chunked")):  # fmt: skip
            self.send_header(name, value)
        self.end_headers()
        obj = "chat.completion.chunk" if chat else "text_completion"

        def piece(text: str | None, reason: str | None, first: bool = False) -> dict[str, Any]:
            if not chat:
                return {"text": text or "", "index": 0, "logprobs": None, "finish_reason": reason}
            delta: dict[str, Any] = {"role": "assistant", "content": None} if first else {}
            if text is not None and not first:
                delta["content"] = text
            return {"index": 0, "finish_reason": reason, "delta": delta}

        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        State.begin()
        completed = False
        try:
            if chat and not DROP_FIRST:
                self.chunk({**base, "object": obj, "choices": [piece(None, None, first=True)]})
            for n, token in enumerate(tokens, start=1):
                self.chunk({**base, "object": obj, "choices": [piece(token, None)]})
                self.pace(n)
            final: dict[str, Any] = {**base, "object": obj, "choices": [piece(None, finish)]}
            timing = timings(prompt_n, len(tokens))
            if with_usage:
                self.chunk(final)
                final = {**base, "object": obj, "choices": [], "usage": usage}
            self.chunk({**final, "timings": timing})
            self.chunk(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            completed = True
        except (BrokenPipeError, ConnectionResetError):
            log("srv          stop: client disconnected, cancelling task")
            self.close_connection = True
        finally:
            State.end(completed)
            log(f"srv  log_server_r: request: POST {self.path} 127.0.0.1 200")

    def client_gone(self) -> bool:
        """True when the client closed its end (readable with nothing to read); no bytes are consumed."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def pace(self, n: int) -> None:
        """Called after the n-th token: crash or wait as the environment says."""
        if n == CRASH_AFTER:
            log(f"srv  fake: crashing after {n} tokens (FAKE_CRASH_AFTER_TOKENS)")
            os.kill(os.getpid(), signal.SIGKILL)
        if TOKEN_DELAY > 0:
            time.sleep(TOKEN_DELAY)


def on_sigterm(signum: int, frame: object) -> None:
    log("srv    operator(): operator(): cleaning up before exit...")
    os._exit(0)


def main(argv: list[str]) -> int:
    settings = Settings(argv)
    apply_per_model(settings.alias, settings.model)
    configure()
    Handler.settings = settings
    if os.environ.get("FAKE_SLOTS") == "1":
        State.slots = threading.BoundedSemaphore(settings.slots)
    if os.environ.get("FAKE_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_sigterm)
    log("build: 0 (fake) with the standard library")
    log(f"main: fake llama-server, pid {os.getpid()}")
    # A listen backlog of 1024 (the standard library's is 5), as llama-server's: 256 streams opened at once
    # are queued, not refused.
    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6,
                                                           "request_queue_size": 1024})
    if ":" not in settings.host:
        server_class = type("Server", (ThreadingHTTPServer,), {"request_queue_size": 1024})
    try:
        server = server_class((settings.host, settings.port), Handler)
    except OSError as exc:
        log(f"srv         start: couldn't bind HTTP server socket, hostname: {settings.host}, "
            f"port: {settings.port} ({exc.strerror})")  # fmt: skip
        log("srv  llama_server: exiting due to HTTP server error")
        return 1
    server.daemon_threads = True
    port = server.server_address[1]
    log(f"main: HTTP server is listening, hostname: {settings.host}, port: {port}, http threads: 4")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log(f"srv    load_model: loading model '{settings.model}'")
    if SILENT:
        threading.Event().wait()
    exit_code = os.environ.get("FAKE_EXIT_ON_LOAD")
    if exit_code is not None:
        log(f"llama_model_load: error loading model: fake failure for '{settings.model}'")
        log(f"srv    load_model: failed to load model, '{settings.model}'")
        log("srv    llama_server: exiting due to model loading error")
        return int(exit_code)
    oom_above = os.environ.get("FAKE_OOM_ABOVE_CTX")
    if oom_above is not None and settings.n_ctx_slot > int(oom_above):
        kv = settings.n_ctx_slot * settings.slots * 24 * 1024  # bytes, as if 24 KiB per token
        log(f"ggml_aligned_malloc: insufficient memory (attempted to allocate {kv / 2**20:.2f} MB)")
        log(f"ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size {kv}")
        log("llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache")
        log(f"common_init_from_params: failed to create context with model '{settings.model}'")
        log(f"srv    load_model: failed to load model, '{settings.model}'")
        log("srv  llama_server: exiting due to model loading error")
        return 1
    delay = float(os.environ.get("FAKE_LOAD_DELAY", "0"))
    interval = float(os.environ.get("FAKE_LOAD_LOG_INTERVAL", "0.1"))
    deadline = time.monotonic() + delay
    step = 0
    while (left := deadline - time.monotonic()) > 0:
        step += 1
        log(f"load_tensors: loading model tensors, fake progress step {step}")
        time.sleep(min(interval, left))
    gate = os.environ.get("FAKE_LOAD_GATE")
    while gate and not os.path.exists(gate):
        step += 1
        log(f"load_tensors: loading model tensors, fake progress step {step} (waiting for {gate})")
        time.sleep(interval)
    s = settings
    log(f"srv    load_model: initializing slots, n_slots = {s.slots}, n_ctx_slot = {s.n_ctx_slot},"
        f" kv_unified = '{str(s.unified).lower()}'")  # fmt: skip
    log("main: model loaded")
    State.ready.set()
    log(f"srv  llama_server: listening on http://{settings.host}:{port}")
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
