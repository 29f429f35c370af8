"""API keys (SPEC G): with ``auth.api_keys`` set, every request must present one of them.

Accepted as ``Authorization: Bearer KEY``, ``x-api-key: KEY`` (Anthropic) or ``x-goog-api-key: KEY``.
Keys are kept only as SHA-256 digests and compared in constant time against every key. A request
without a valid key gets 401 with ``WWW-Authenticate: Bearer realm="llmman"``. ``GET /`` and
``/api/version`` stay open (liveness checks carry no key).
"""

from __future__ import annotations

import hashlib
import hmac

import orjson

from llmman.api.aggregate import ASGIApp, Receive, Scope, Send

OPEN_PATHS = frozenset({"/", "/api/version"})
MESSAGE = ("unauthorized: present an API key as 'Authorization: Bearer <key>', 'x-api-key: <key>' "
           "or 'x-goog-api-key: <key>'")


def digests(keys: str) -> tuple[bytes, ...]:
    """The SHA-256 digests of the comma-separated ``keys`` (blank entries ignored)."""
    return tuple(hashlib.sha256(k.strip().encode()).digest() for k in keys.split(",") if k.strip())


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

    def __init__(self, app: ASGIApp, keys: str) -> None:
        self.app = app
        self.keys = digests(keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (not self.keys or scope["type"] != "http" or scope["path"] in OPEN_PATHS
                or accepted(self.keys, scope["headers"])):
            return await self.app(scope, receive, send)
        body = orjson.dumps({"error": MESSAGE})
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b'Bearer realm="llmman"')]})
        await send({"type": "http.response.body", "body": body})
