"""The web dashboard (docs/dashboard.md): ``GET /ui`` and ``/ui/<file>`` serve the plain files of
``llmman/ui`` (shipped as package data, no build step), and ``GET /llmman/devices`` gives the dashboard
every node's devices.

The files hold no data, so ``/ui`` and ``/ui/...`` are open (llmman.api.auth.OPEN_PREFIXES); every call the
page makes for data presents the key the user typed into its login form. Each file is answered with
``Content-Security-Policy: default-src 'self'`` (plus ``frame-ancestors 'none'``): the browser refuses
anything from elsewhere, so the page cannot load a script, style or font from outside the daemon.

``/llmman/devices?pool=1``::

    {"nodes": [{"name": "spark", "address": "10.0.0.7:17434", "self": true,
                "devices": [{"index": 0, "name": ..., "total": bytes, "used": bytes, "utilisation": pct,
                             "temperature": celsius, "power": watts, ...}, ...]}, ...]}

``devices`` is the ``/llmman/node`` list of each node (llmman.cluster.state.node_document); without
``pool=1`` only this node is listed, and a peer that does not answer is left out.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.ollama_infer import json_response
from llmman.api.services import Services
from llmman.cluster.peers import peer_name
from llmman.cluster.state import node_document
from llmman.config.table import HostAddress
from llmman.errors import NotFound

FILES = Path(__file__).resolve().parent.parent / "ui"
"""The dashboard's files (``src/llmman/ui``)."""

CSP = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
"""Everything the page loads comes from the daemon."""

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")


def ui_file(name: str) -> tuple[bytes, str]:
    """The bytes and content type of the dashboard file ``name`` (``""``: ``index.html``).

    Raises:
        NotFound: no such file (or a name that is not a plain file name of the directory).
    """
    name = name or "index.html"
    path = FILES / name
    kind = TYPES.get(path.suffix)
    if not _NAME.fullmatch(name) or ".." in name or kind is None or not path.is_file():
        raise NotFound(f"no dashboard file {name!r}")
    return path.read_bytes(), kind


async def page(request: Request) -> Response:
    """``GET /ui``, ``/ui/`` and ``/ui/<file>``."""
    body, kind = await asyncio.to_thread(ui_file, request.path_params.get("name", ""))
    return Response(body, media_type=kind, headers={
        "content-security-policy": CSP, "x-content-type-options": "nosniff",
        "cache-control": "no-cache", "referrer-policy": "no-referrer"})


async def devices(request: Request) -> Response:
    """``GET /llmman/devices``."""
    services: Services = request.app.state.services
    settings = services.settings
    mine = node_document(services.scheduler, services.store, name=settings.node_name,
                         fallback=settings.fallback, max_queue=settings.max_queue)
    nodes = [{"name": settings.node_name, "address": settings.host.netloc, "self": True,
              "devices": mine["devices"]}]
    peers = services.peers
    if peers and request.query_params.get("pool", "").lower() in ("1", "true", "yes"):
        async def one(address: HostAddress) -> dict[str, Any] | None:
            try:
                doc = await peers.get_json(address, "/llmman/node")
            except (OSError, aiohttp.ClientError, TimeoutError, ValueError):
                return None
            if not isinstance(doc, dict):
                return None
            found = doc.get("devices")
            return {"name": doc.get("name") or peer_name(address), "address": peer_name(address),
                    "self": False, "devices": found if isinstance(found, list) else []}

        nodes += [n for n in await asyncio.gather(*(one(a) for a in peers.up())) if n is not None]
    return json_response({"nodes": nodes})
