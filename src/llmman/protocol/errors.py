"""Every dialect's error body and in-band error frame, rendered in this one place.

Before the first byte of an answer a failure gets its real HTTP status and the dialect's error body;
after it, one in-band frame ends the stream (Ollama's rule, kept by every dialect):

* Ollama: body ``{"error": "<text>"}``; frame: the same object as an NDJSON line.
* OpenAI: body ``{"error": {"message", "type", "param", "code"}}``; frame: ``data: <that body>``
  (as llama-server reports late errors).
* Responses: OpenAI's body; frame: ``event: error`` with ``{"type": "error", "code", "message", "param"}``.
* Anthropic: body ``{"type": "error", "error": {"type", "message"}}``; frame: ``event: error`` with it.

The dialect follows from the path a client called (:func:`dialect_of`): ``/v1/messages…`` is
Anthropic's, ``/v1/responses…`` the Responses API's, anything else under ``/v1/`` OpenAI's, the rest
Ollama's. A stream's frame follows :func:`stream_dialect`: llama-server's ``/infill`` streams its own SSE, so
a late failure there is OpenAI's ``data:`` frame although its errors before the first byte are Ollama's.
No I/O here.
"""

from __future__ import annotations

from enum import Enum

import orjson

from llmman.protocol.anthropic.messages import anthropic_error
from llmman.protocol.framing import ndjson, sse
from llmman.protocol.openai.shapes import openai_error, upstream_message


class Dialect(Enum):
    """The API dialect a route speaks."""

    OLLAMA = "ollama"
    OPENAI = "openai"
    RESPONSES = "responses"
    ANTHROPIC = "anthropic"


def dialect_of(path: str) -> Dialect:
    """The dialect of the route at ``path`` (``/v1/messages/count_tokens`` is Anthropic's, ``/api/chat``
    Ollama's)."""
    if not path.startswith("/v1/"):
        return Dialect.OLLAMA
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return Dialect.ANTHROPIC
    if path == "/v1/responses" or path.startswith("/v1/responses/"):
        return Dialect.RESPONSES
    return Dialect.OPENAI


#: Routes outside ``/v1/`` whose streams are llama-server's SSE (api/llama_routes.py): an NDJSON error line
#: would be no event to an SSE client, which would see the stream just stop.
SSE_PATHS = ("/infill",)


def stream_dialect(path: str) -> Dialect:
    """The dialect of the in-band frame that ends a failed stream of the route at ``path``: OpenAI's for
    :data:`SSE_PATHS` (llama-server's own late-error event), else :func:`dialect_of`."""
    return Dialect.OPENAI if path in SSE_PATHS else dialect_of(path)


def error_document(dialect: Dialect, message: str, status: int, code: str | None = None) -> dict[str, object]:
    """The JSON error body of ``dialect`` as a dict (``code`` is the machine code, e.g.
    ``model_not_found``; only the OpenAI shapes carry it)."""
    if dialect is Dialect.ANTHROPIC:
        return anthropic_error(message, status=status)
    if dialect is Dialect.OLLAMA:
        return {"error": message}
    return openai_error(message, status=status, code=code)


def error_body(dialect: Dialect, message: str, status: int, code: str | None = None) -> bytes:
    """:func:`error_document` encoded, the body of an error response."""
    return orjson.dumps(error_document(dialect, message, status, code))


def error_frame(dialect: Dialect, message: str, status: int = 500, code: str | None = None) -> bytes:
    """The one in-band frame that ends a stream of ``dialect`` that failed after its first byte."""
    if dialect is Dialect.OLLAMA:
        return ndjson({"error": message})
    if dialect is Dialect.ANTHROPIC:
        return sse(anthropic_error(message, status=status), event="error")
    if dialect is Dialect.RESPONSES:
        return sse({"type": "error", "code": code, "message": message, "param": None}, event="error")
    return sse(openai_error(message, status=status, code=code))


def upstream_text(body: bytes) -> str:
    """What a llama-server error answer says: its ``error.message`` (or ``error`` string), else the raw
    text, else ``llama-server returned an error``."""
    message = upstream_message(body)
    if message is not None:
        return message
    return body.decode("utf-8", "replace").strip() or "llama-server returned an error"
