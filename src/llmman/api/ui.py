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
                             "temperature": celsius, "power": watts, ...}, ...],
                "transfers": [{"model": ref, "kind": "pull" | "copy", "source": host, "completed": bytes,
                               "total": bytes, ...}, ...]}, ...]}

``devices`` and ``transfers`` are the ``/llmman/node`` lists of each node (llmman.cluster.state.node_document;
a peer's transfers read by llmman.cluster.state.transfers_of): its devices, and its pulls and copies in
progress (llmman.registry.progress). Without ``pool=1`` only this node is listed, and a peer that does
not answer is left out.

``/llmman/on/{node}/api/{name}`` makes one of the dashboard's model calls on a given node of the pool
(:data:`ON_NODE`: ``GET tags``, ``POST generate`` (load, unload), ``POST pull``, ``DELETE delete``): ``node``
is a peer's ``host:port`` or name, and the call goes to it with the peer headers (the hop mark, so that the
peer answers for itself, and the peer key); its answer, streamed (a pull's NDJSON progress), is this one's.
Naming this node answers ``307`` to ``/api/{name}`` (the hop mark makes ``/api/tags`` this node's own).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from llmman.api.ollama_infer import json_response
from llmman.api.services import Services
from llmman.cluster.peers import Peers, peer_name
from llmman.cluster.state import node_document, transfers_of
from llmman.config.table import HostAddress
from llmman.errors import LlmmanError, NotFound

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
    transfers = services.puller.transfers.snapshot() if services.puller is not None else []
    mine = node_document(services.scheduler, services.store, name=settings.node_name,
                         fallback=settings.fallback, max_queue=settings.max_queue, transfers=transfers)
    nodes = [{"name": settings.node_name, "address": settings.host.netloc, "self": True,
              "devices": mine["devices"], "transfers": mine["transfers"]}]
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
                    "self": False, "devices": found if isinstance(found, list) else [],
                    "transfers": transfers_of(doc)}

        nodes += [n for n in await asyncio.gather(*(one(a) for a in peers.up())) if n is not None]
    return json_response({"nodes": nodes})


ON_NODE = frozenset({("GET", "tags"), ("POST", "generate"), ("POST", "pull"), ("DELETE", "delete")})
"""The calls ``/llmman/on/{node}/api/{name}`` passes on: ``(method, name)``."""

PASSED_HEADERS = ("cache-control", "x-accel-buffering")
"""The peer's answer headers passed on besides its content type (a pull's stream is not buffered)."""


def _peer(peers: Peers | None, node: str) -> HostAddress | None:
    """The configured peer named ``node`` (its ``host:port``, or the name it reports), or None."""
    for state in peers.states() if peers else []:
        seen = state.seen.view.node if state.seen is not None else ""
        if node in (peer_name(state.address), seen):
            return state.address
    return None


async def on_node(request: Request) -> Response:
    """``/llmman/on/{node}/api/{name}`` (see the module docstring).

    Raises:
        NotFound: a call not in :data:`ON_NODE`, or a node that is not in the pool.
        LlmmanError: 502 when the peer cannot be reached.
    """
    services: Services = request.app.state.services
    settings = services.settings
    node, name = request.path_params["node"], request.path_params["name"]
    if (request.method, name) not in ON_NODE:
        raise NotFound(f"no dashboard call {request.method} /api/{name}")
    if node in (settings.node_name, settings.host.netloc):
        return RedirectResponse(f"/api/{name}", status_code=307)
    peers = services.peers
    address = _peer(peers, node)
    if peers is None or address is None:
        raise NotFound(f"no node {node!r} in the pool")
    headers = {**peers.headers(), "Content-Type": request.headers.get("content-type", "application/json")}
    try:
        answer = await peers.session.request(
            request.method, address.client_url() + f"/api/{name}", data=await request.body(), headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=peers.timeout))
    except (OSError, aiohttp.ClientError, TimeoutError) as exc:
        raise LlmmanError(f"node {node} cannot be reached: {exc}", status=502,
                          code="peer_unreachable") from None

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in answer.content.iter_any():
                yield chunk
        finally:
            answer.release()

    kept = {k: v for k in PASSED_HEADERS if (v := answer.headers.get(k)) is not None}
    return StreamingResponse(body(), status_code=answer.status, headers=kept,
                             media_type=answer.headers.get("content-type", "application/json"))
