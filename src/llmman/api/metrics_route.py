"""``GET /metrics``: this daemon's Prometheus metrics, its llama-server children's folded in.

Behind the API keys like every route; ``metrics.scrape_key`` opens this one path to a scraper too
(llmman.api.auth.ApiKeys). The families are llmman.obs.metrics'; each child's own ``/metrics`` is asked for
at scrape time (llmman.obs.children.scrape) and labelled with its ``model``. With ``metrics.collect`` off
(``LLMMAN_METRICS=off``) nothing is counted and the route answers 404 in Ollama's shape, as a path the
daemon does not serve. See docs/observability.md.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from llmman.api.services import Services
from llmman.errors import NotFound
from llmman.obs.children import scrape

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the text format generate_latest writes


async def metrics(request: Request) -> Response:
    """``GET /metrics``."""
    services: Services = request.app.state.services
    obs = services.obs
    if not obs.metrics.collect:
        raise NotFound("metrics are off on this node (metrics.collect = false, LLMMAN_METRICS=off)")
    children = await scrape(obs.children.current(services.scheduler.snapshot()))
    return Response(obs.metrics.exposition(children), media_type=CONTENT_TYPE)
