"""``GET /llmman/node``: this node's memory, models and load, the aggregation's probe (docs/memory.md).

The document is built by :func:`llmman.cluster.state.node_document` (its shape is documented there and
in docs/aggregation.md), where peers also read it. Its ``transfers`` are the puller's pulls and copies in
progress (llmman.registry.progress).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from llmman.api.listing import stored_listing
from llmman.api.ollama_infer import json_response
from llmman.api.services import Services
from llmman.cluster.state import node_document


async def node(request: Request) -> Response:
    """``GET /llmman/node``."""
    services: Services = request.app.state.services
    settings = services.settings
    transfers = services.puller.transfers.snapshot() if services.puller is not None else []
    listing = await stored_listing(services)  # off the event loop when the store changed
    return json_response(node_document(services.scheduler, services.store, name=settings.node_name,
                                       fallback=settings.fallback, max_queue=settings.max_queue,
                                       transfers=transfers, stored=listing.sizes))
