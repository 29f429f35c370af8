"""``GET /llmman/node``: this node's memory and models, the aggregation's probe (docs/memory.md).

Body (bytes, counts)::

    {"memory": capacity, "free": capacity - loaded, "accelerator": "cuda",
     "loaded": {ref: bytes}, "stored": {ref: bytes}, "in_flight": n, "queued": n, "max_queue": n}

``memory`` is what llmman offers for models (0 = unknown: no limit is enforced); ``loaded`` counts
each loaded or loading model at llama-server's reported figure once loaded, else its estimate;
``stored`` is each stored model's weight bytes.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from llmman.api.ollama_infer import json_response
from llmman.api.services import Services


async def node(request: Request) -> Response:
    """``GET /llmman/node``."""
    services: Services = request.app.state.services
    scheduler = services.scheduler
    snaps = scheduler.snapshot()
    loaded: dict[str, int] = {}
    for snap in snaps:
        loaded[snap.reference] = loaded.get(snap.reference, 0) + snap.memory
    used = sum(loaded.values())
    capacity = scheduler.capacity
    return json_response({
        "memory": capacity,
        "free": max(0, capacity - used),
        "loaded": loaded,
        "stored": {m.reference: m.size for m in services.store.list()},
        "in_flight": sum(snap.refcount for snap in snaps) - scheduler.queued(),
        "queued": scheduler.queued(),
        "max_queue": services.settings.max_queue,
    })
