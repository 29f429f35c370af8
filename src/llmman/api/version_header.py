"""``x-llmman-version`` on every answer: llmman's own version, since ``/api/version`` reports the Ollama API
level (protocol/ollama/version.py). Outermost in the middleware stack, so refusals (CORS, keys, limits)
carry it too; a forwarded answer carries this node's version, not the peer's."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmman import __version__
from llmman.protocol.ollama.version import VERSION_HEADER

_NAME = VERSION_HEADER.encode("latin-1")
_VALUE = __version__.encode("latin-1")


class VersionHeader:
    """ASGI middleware adding :data:`~llmman.protocol.ollama.version.VERSION_HEADER` to each HTTP answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != _NAME]
                message = {**message, "headers": [*headers, (_NAME, _VALUE)]}
            await send(message)

        await self.app(scope, receive, sending)
