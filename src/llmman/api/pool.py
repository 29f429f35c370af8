"""The pool's list answers: ``GET /api/ps``, ``/api/tags`` and ``/v1/models`` from any node show every
node's entries (merged by cluster/views.py).

A request a peer forwarded (``x-llmman-hop``) and a node without peers get this node's own list.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.services import Services
from llmman.cluster.peers import HOP, peer_name
from llmman.cluster.views import merge

Handler = Callable[[Request], Awaitable[Response]]


def pooled(path: str, handler: Handler) -> Handler:
    """``handler`` (this node's list at ``path``, one of cluster.views.MERGED) with the peers' entries."""

    async def route(request: Request) -> Response:
        services: Services = request.app.state.services
        peers = services.peers
        if not peers or HOP in request.headers:
            return await handler(request)
        remote_task = asyncio.ensure_future(peers.gather(path))
        try:
            response = await handler(request)
        except BaseException:
            remote_task.cancel()
            raise
        remote = await remote_task
        if response.status_code != 200 or not remote:
            return response
        try:
            doc = merge(path, orjson.loads(response.body), [(peer_name(a), d) for a, d in remote])
        except orjson.JSONDecodeError:
            return response
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        return Response(orjson.dumps(doc), status_code=200, headers=headers)

    return route
