"""CORS and the Host-header guard, as Ollama does them (``server/routes.go``, ``OLLAMA_ORIGINS``).

One pure ASGI middleware, outermost, so a browser's preflight is answered before authentication:

1. **CORS** (gin-contrib/cors as Ollama configures it). A request without ``Origin``, or whose
   ``Origin`` is ``http(s)://<its own Host>``, is not a CORS request and passes untouched. Otherwise the
   origin must match the built-in list (:data:`DEFAULT_ORIGINS`) or ``LLMMAN_ORIGINS`` /
   ``OLLAMA_ORIGINS`` (comma-separated, one ``*`` wildcard per entry, ``*`` alone = any origin), else
   403. An allowed ``OPTIONS`` preflight gets 204 with the allowed methods, headers and a 12 h max age;
   any other allowed request gets ``Access-Control-Allow-Origin`` (the origin, or ``*``) and
   ``Vary: Origin`` on its answer.
2. **Host guard** against DNS rebinding, only when the daemon is bound to loopback: the ``Host``
   header must be a loopback, private, unspecified or local-interface IP, empty, ``localhost``, this
   machine's hostname or a ``*.localhost`` / ``*.local`` / ``*.internal`` name, else 403. Bound to
   anything else (``0.0.0.0``), every Host is accepted.

Refusals carry a JSON error in the route's dialect (Ollama's own body is empty).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Collection, Iterable

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmman.api.errors import error_response
from llmman.config.settings import Settings

__all__ = ["DEFAULT_ORIGINS", "CORSAndHostGuard", "host_allowed", "origin_allowed", "origin_patterns"]

#: Always allowed (Ollama's ``envconfig.AllowedOrigins``).
DEFAULT_ORIGINS = (
    *(f"{scheme}://{host}{port}" for host in ("localhost", "127.0.0.1", "0.0.0.0")
      for scheme in ("http", "https") for port in ("", ":*")),
    "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*",
)

#: Ollama's list, plus the headers the Anthropic SDK and llmman's API keys use.
ALLOWED_HEADERS = ", ".join((
    "Authorization", "Content-Type", "User-Agent", "Accept", "X-Requested-With", "OpenAI-Beta",
    "x-stainless-arch", "x-stainless-async", "x-stainless-custom-poll-interval",
    "x-stainless-helper-method", "x-stainless-lang", "x-stainless-os", "x-stainless-package-version",
    "x-stainless-poll-helper", "x-stainless-retry-count", "x-stainless-runtime",
    "x-stainless-runtime-version", "x-stainless-timeout",
    "x-api-key", "x-goog-api-key", "anthropic-version", "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
))
ALLOWED_METHODS = "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"
MAX_AGE_S = 12 * 3600
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal")


def origin_patterns(extra: Iterable[str]) -> tuple[str, ...]:
    """The allowed-origin patterns: ``extra`` (``Settings.origin_list``; blanks dropped) then the defaults."""
    return tuple(p.strip() for p in extra if p.strip()) + DEFAULT_ORIGINS


def origin_allowed(origin: str, patterns: Iterable[str]) -> bool:
    """True when ``origin`` equals a pattern, or matches one with a ``*`` (prefix and suffix around
    it); the pattern ``*`` matches everything."""
    for pattern in patterns:
        if pattern == "*" or pattern == origin:
            return True
        if "*" in pattern:
            prefix, _, suffix = pattern.partition("*")
            if len(origin) >= len(prefix) + len(suffix) and origin.startswith(prefix) and origin.endswith(
                suffix
            ):
                return True
    return False


def split_host(host_header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:80`` -> ``::1``, ``a.b:80`` -> ``a.b``), lowercased."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host


def host_allowed(host_header: str, *, hostname: str, local_ips: Collection[str]) -> bool:
    """The DNS-rebinding rule for a loopback-bound daemon (Ollama's ``allowedHostsMiddleware``)."""
    host = split_host(host_header)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host in ("", "localhost", hostname.lower()) or host.endswith(_LOCAL_SUFFIXES)
    return ip.is_loopback or ip.is_private or ip.is_unspecified or str(ip) in local_ips


def _local_ips() -> frozenset[str]:
    """This machine's addresses as its hostname resolves (best effort; empty when it does not)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        return frozenset()
    return frozenset(str(info[4][0]).split("%", 1)[0] for info in infos)


class CORSAndHostGuard:
    """The middleware; ``settings.allowed_origins`` and ``settings.host`` configure it."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.patterns = origin_patterns(settings.origin_list)
        self.allow_all = "*" in self.patterns
        self.guard = settings.host.is_loopback()
        self.hostname = socket.gethostname()
        self.local_ips = _local_ips() if self.guard else frozenset()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host, origin = headers.get("host", ""), headers.get("origin", "")
        cors = bool(origin) and origin not in (f"http://{host}", f"https://{host}")
        if cors and not origin_allowed(origin, self.patterns):
            await self._refuse(scope, receive, send, f"origin {origin} not allowed")
            return
        allow_origin = "*" if self.allow_all else origin
        if cors and scope["method"] == "OPTIONS":
            await Response(status_code=204, headers={
                "Access-Control-Allow-Origin": allow_origin, "Access-Control-Allow-Methods": ALLOWED_METHODS,
                "Access-Control-Allow-Headers": ALLOWED_HEADERS, "Access-Control-Max-Age": str(MAX_AGE_S),
                "Vary": "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
            })(scope, receive, send)
            return
        if self.guard and not host_allowed(host, hostname=self.hostname, local_ips=self.local_ips):
            await self._refuse(scope, receive, send, f"host {host} not allowed")
            return
        if not cors:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                out["Access-Control-Allow-Origin"] = allow_origin
                out.add_vary_header("Origin")
            await send(message)

        await self.app(scope, receive, send_with_cors)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, why: str) -> None:
        await error_response(scope["path"], why, 403)(scope, receive, send)
