"""``GET /health``: 200 ``{"status": "ok"}`` while serving, 503 once shutting down or when the store is
unreadable (llmman.obs.health.Health). Open without a key, like ``/api/version`` (llmman.api.auth)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from llmman.api.ollama_infer import json_response
from llmman.api.services import Services


async def health(request: Request) -> Response:
    """``GET /health`` (and ``HEAD``)."""
    services: Services = request.app.state.services
    status, body = services.obs.health.check(services.store, draining=services.scheduler.draining)
    return json_response(body, status)
