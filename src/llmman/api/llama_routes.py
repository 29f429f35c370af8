"""llama-server's own routes through llmman, per model: ``/tokenize``, ``/detokenize``, ``/apply-template``,
``/infill`` and reranking (``/rerank``, ``/reranking``, ``/v1/rerank``, ``/v1/reranking``).

The path and body are llama-server's, with the model named in the body's ``model`` (llama-swap's scheme;
protocol/llama_routes.py). Each request goes through the pipeline (api/inference.py) like every inference
route: placed in the pool, forwarded as it came, or served here on the model's child, which is loaded on
demand (the chat child; a reranker's embedding child for reranking). The child's answer is relayed as it
is (:func:`~llmman.api.relay.passthrough`: streamed for ``/infill`` with ``stream: true``), except that its
model alias becomes the name the client sent, and its 501 (not supported by this model, so by no node)
becomes a 400 that does not send the request on to the next node.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from llmman.api.cancel import unless_disconnected
from llmman.api.inference import Call, run
from llmman.api.relay import passthrough
from llmman.api.services import Services
from llmman.errors import BadRequest, UpstreamError
from llmman.gateway import ResolvedModel
from llmman.protocol.capabilities import capability_error
from llmman.protocol.errors import stream_dialect, upstream_text
from llmman.protocol.llama_routes import RERANK_PATHS, detokenize_error, reranking_error, reranks, top_n_error
from llmman.protocol.ollama.fields import parse_json_body, require_model


async def llama_route(request: Request) -> Response:
    """``POST`` one of llama-server's routes for the model named in the body.

    Raises:
        BadRequest: no JSON object body, no ``model``; ``/infill`` for a model without FIM tokens
            (the ``insert`` capability); reranking for a model that is not a reranker, or with a
            ``top_n`` below 0 or past 2**31 - 1; ``/detokenize`` of an id outside the model's vocabulary.
    """
    raw = await request.body()
    body = parse_json_body(raw)
    name = require_model(body)
    path = request.url.path
    rerank = path in RERANK_PATHS
    if rerank and (wrong_top := top_n_error(body.get("top_n"))):
        raise BadRequest(wrong_top)  # the same on every node: refused here, before placing it

    async def serve(model: ResolvedModel) -> Response:
        services: Services = request.app.state.services
        info = services.store.info(model.stored)
        if rerank and not reranks(info.architecture, info.metadata):
            raise BadRequest(reranking_error(name))
        if path == "/infill" and (missing := capability_error(name, "generate", ("insert",),
                                                              info.capabilities)):
            raise BadRequest(missing)
        if path == "/detokenize" and (wrong := detokenize_error(body.get("tokens"), info.metadata)):
            raise BadRequest(wrong)
        content_type = request.headers.get("content-type", "application/json")
        opening = services.gateway.open(model, path, raw, content_type=content_type, embedding=rerank)
        exchange = await unless_disconnected(request, opening)
        if exchange.status == 501:  # llama-server: "not supported" by this model, the same on every node
            raise UpstreamError(upstream_text(await exchange.read()), 400)
        return await passthrough(request, exchange, stream=body.get("stream") is True,
                                 dialect=stream_dialect(path), requested=name)

    return await run(request, Call(name, serve))
