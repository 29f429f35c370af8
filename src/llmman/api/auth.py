"""API keys (docs/aggregation.md): with ``auth.api_keys`` set, every request must present one of them.

Accepted as ``Authorization: Bearer KEY``, ``x-api-key: KEY`` (Anthropic) or ``x-goog-api-key: KEY``.
Keys are kept only as SHA-256 digests and compared in constant time against every key. A request
without a valid key gets 401 with ``WWW-Authenticate: Bearer realm="llmman"`` and a body in the route's
dialect (:func:`unauthorized_body`). ``GET /``, ``/api/version`` and ``/health`` stay open (liveness checks
carry no key), and so do the dashboard's files under ``/ui`` (its data calls carry the key); ``/metrics``
also takes the scrape key (``metrics.scrape_key``, docs/observability.md).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from llmman.protocol.errors import Dialect, dialect_of
from llmman.protocol.openai.shapes import openai_error

OPEN_PATHS = frozenset({"/", "/api/version", "/health"})
OPEN_UI = "/ui"  # the dashboard's files, /ui and /ui/... (llmman.api.ui): they hold no data
SCRAPE_PATH = "/metrics"  # the one path the scrape key opens
MESSAGE = ("unauthorized: present an API key as 'Authorization: Bearer <key>', 'x-api-key: <key>' "
           "or 'x-goog-api-key: <key>'")


def unauthorized_body(path: str) -> bytes:
    """The 401 body for ``path``'s dialect: OCI ``{"errors": [{"code": "UNAUTHORIZED"}]}`` on ``/v2/``,
    Anthropic's ``authentication_error`` on ``/v1/messages``, OpenAI's ``invalid_request_error`` with
    code ``invalid_api_key`` (what api.openai.com answers) elsewhere under ``/v1/``, else Ollama's
    ``{"error": "..."}``."""
    if path == "/v2" or path.startswith("/v2/"):
        return orjson.dumps({"errors": [{"code": "UNAUTHORIZED", "message": MESSAGE}]})
    dialect = dialect_of(path)
    if dialect is Dialect.ANTHROPIC:
        return orjson.dumps({"type": "error", "error": {"type": "authentication_error", "message": MESSAGE}})
    if dialect is not Dialect.OLLAMA:
        return orjson.dumps(openai_error(MESSAGE, status=401, type_="invalid_request_error",
                                         code="invalid_api_key"))
    return orjson.dumps({"error": MESSAGE})


def digests(keys: Iterable[str]) -> tuple[bytes, ...]:
    """The SHA-256 digests of ``keys`` (``Settings.api_key_list``; blank entries ignored)."""
    return tuple(hashlib.sha256(k.strip().encode()).digest() for k in keys if k.strip())


def presented(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """Every key the request presents, in any of the three spellings."""
    out = []
    for name, value in headers:
        lname = name.lower()
        if lname == b"authorization" and value[:7].lower() == b"bearer ":
            out.append(value[7:].strip())
        elif lname in (b"x-api-key", b"x-goog-api-key"):
            out.append(value.strip())
    return out


def accepted(keys: tuple[bytes, ...], headers: list[tuple[bytes, bytes]]) -> bool:
    """True when one presented key matches one of ``keys`` (every comparison is made)."""
    ok = False
    for key in presented(headers):
        digest = hashlib.sha256(key).digest()
        for known in keys:
            ok |= hmac.compare_digest(digest, known)
    return ok


class ApiKeys:
    """The middleware; a no-op when no keys are configured."""

    def __init__(self, app: ASGIApp, keys: Iterable[str], scrape_keys: Iterable[str] = ()) -> None:
        self.app = app
        self.keys = digests(keys)
        self.scrape_keys = self.keys + digests(scrape_keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (not self.keys or scope["type"] != "http" or scope["path"] in OPEN_PATHS
                or scope["path"] == OPEN_UI or scope["path"].startswith(OPEN_UI + "/")
                or accepted(self.scrape_keys if scope["path"] == SCRAPE_PATH else self.keys,
                            scope["headers"])):
            await self.app(scope, receive, send)
            return
        body = unauthorized_body(scope["path"])
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b'Bearer realm="llmman"')]})
        await send({"type": "http.response.body", "body": body})
