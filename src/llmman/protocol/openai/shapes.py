"""Small helpers for the OpenAI dialect: error bodies, peeking at a request, ``GET /v1/models``.

OpenAI requests are passed to llama-server byte for byte, so llmman only reads ``model`` and ``stream``.
Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``, ``type`` following the status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import orjson

from llmman.errors import BadRequest

__all__ = [
    "CLIENT_FAULTS",
    "ModelEntry",
    "client_fault",
    "error_type",
    "models_list",
    "openai_error",
    "peek_model",
    "remap_upstream_error",
    "upstream_message",
    "wants_stream",
]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


@dataclass(frozen=True)
class ModelEntry:
    """One ``/v1/models`` entry: ``created`` in Unix seconds, ``context_length`` in tokens (None: unknown)."""

    id: str
    created: int
    context_length: int | None = None
    owned_by: str = "llmman"


def error_type(status: int) -> str:
    """The OpenAI/llama-server error ``type`` for an HTTP status (other 4xx: invalid_request_error, 5xx:
    server_error)."""
    if status in _TYPES:
        return _TYPES[status]
    return "server_error" if status >= 500 else "invalid_request_error"


def openai_error(
    message: str, *, status: int, type_: str | None = None, code: str | None = None, param: str | None = None
) -> dict[str, object]:
    """``{"error": {"message", "type", "param", "code"}}``, the shape the OpenAI SDKs parse.

    ``type_`` defaults to :func:`error_type` of ``status``; ``code`` is e.g. ``"model_not_found"`` or None;
    ``param`` names the offending request field (e.g. ``messages[0].role``) or is None.
    """
    return {"error": {"message": message, "type": type_ or error_type(status), "param": param, "code": code}}


#: Beginnings of llama-server error messages that are the client's fault although llama-server answers
#: them with a 500: they come from converting the request (parsing ``messages``/``tools`` for the chat
#: template, media the model cannot take, template-only parameters), before any generation.
CLIENT_FAULTS = (
    "Failed to parse messages",
    "Failed to parse tools",
    "Failed to parse tool",
    "image input is not supported",
    "audio input is not supported",
    "video input is not supported",
    "tools param requires --jinja",
    "Unsupported param: ",
    "Cannot use custom grammar constraints with tools",
    'Either "json_schema" or "grammar" can be specified',
    "Failed to load image",
    "Failed to load audio",
    "input (",  # "input (N tokens) is too large to process. increase the physical batch size" (embeddings)
)


def client_fault(status: int, message: str) -> bool:
    """Whether a llama-server error answer is really a bad request (so llmman answers 400, not 500).

    The rule: only a **500**, only one that arrives as the answer's status line (before the first byte of
    a body, so the client can still be told the right status), and only when the message begins with one
    of :data:`CLIENT_FAULTS`. llama-server turns every exception other than a JSON type error into a 500
    (its catch-all error handler), including these request-conversion failures, which are entirely
    determined by the request: the same body fails the same way every time. Everything else keeps its
    status: runtime failures ("Context size has been exceeded", a crash, "Loading model" 503, ...) are
    not the client's to fix.
    """
    return status == 500 and message.startswith(CLIENT_FAULTS)


def upstream_message(body: bytes) -> str | None:
    """The ``message`` of a llama-server error body ``{"error": {"message": ...}}`` (or ``{"error":
    "..."}``); None when the body is not one."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    err = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    return err if isinstance(err, str) else None


def remap_upstream_error(status: int, body: bytes) -> tuple[int, bytes]:
    """``(status, body)`` to send for a llama-server error answer: a :func:`client_fault` 500 becomes a
    400 with ``type: invalid_request_error`` and the same message. Any other error object whose ``code``
    is llama-server's integer status (``{"error": {"code": 400, "message", "type"}}``) keeps its status
    but gets OpenAI's shape, where ``code`` is a string or null and ``param`` is present:
    ``{"error": {"message", "type", "param": null, "code": null, ...}}`` (llama-server's extra fields, e.g.
    ``n_prompt_tokens``/``n_ctx``, are kept). Anything else is returned unchanged."""
    message = upstream_message(body)
    if message is None:
        return status, body
    if client_fault(status, message):
        return 400, orjson.dumps(openai_error(message, status=400))
    err = orjson.loads(body).get("error") if status >= 400 else None
    if not isinstance(err, dict) or isinstance(err.get("code"), str | None):
        return status, body
    kind, param = err.get("type"), err.get("param")
    shaped: dict[str, object] = {"message": message,
                                 "type": kind if isinstance(kind, str) else error_type(status),
                                 "param": param if isinstance(param, str) else None, "code": None}
    extra = {k: v for k, v in err.items() if k not in shaped}
    return status, orjson.dumps({"error": {**shaped, **extra}})


def peek_model(raw: bytes) -> tuple[dict[str, object], str]:
    """Parse an OpenAI request body just enough to route it: returns ``(body, model)``.

    Raises:
        BadRequest: the body is empty, not JSON or not an object (``We could not parse the JSON body of your
            request.``), or ``model`` is missing/empty/not a string (``you must provide a model parameter``).
    """
    try:
        body = orjson.loads(raw) if raw.strip() else None
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        raise BadRequest("We could not parse the JSON body of your request. The API expects a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("you must provide a model parameter")
    return body, model


def wants_stream(body: Mapping[str, object]) -> bool:
    """Whether an OpenAI request streams: only a literal ``"stream": true`` does (OpenAI's default: false)."""
    return body.get("stream") is True


def _field(entry: object, name: str) -> object:
    return entry.get(name) if isinstance(entry, Mapping) else getattr(entry, name, None)


def models_list(entries: Iterable[ModelEntry | Mapping[str, object] | object]) -> dict[str, object]:
    """The ``GET /v1/models`` body: ``{"object": "list", "data": [{id, object: "model", created, owned_by,
    context_length?, max_model_len?, meta?}]}``. ``data`` is ``[]`` when empty (never null, unlike Ollama).

    Accepts :class:`ModelEntry`, mappings or any object with ``id``, ``created`` (int seconds) and
    ``context_length`` (int or None) attributes; ``owned_by`` defaults to ``"llmman"``. ``max_model_len`` (the
    vLLM name some clients read) repeats ``context_length``; ``meta`` (llama-server's ``n_ctx`` and
    ``n_ctx_train`` names) is copied when the entry has one.
    """
    data: list[dict[str, object]] = []
    for entry in entries:
        created = _field(entry, "created")
        item: dict[str, object] = {
            "id": str(_field(entry, "id")),
            "object": "model",
            "created": created if isinstance(created, int) and not isinstance(created, bool) else 0,
            "owned_by": str(_field(entry, "owned_by") or "llmman"),
        }
        ctx = _field(entry, "context_length")
        if isinstance(ctx, int) and not isinstance(ctx, bool):
            item["context_length"] = ctx
            item["max_model_len"] = ctx
        meta = _field(entry, "meta")
        if isinstance(meta, Mapping) and meta:
            item["meta"] = dict(meta)
        data.append(item)
    return {"object": "list", "data": data}
