"""The one inference pipeline: every inference route of every dialect goes through :func:`run`.

1. The dialect's route (api/ollama_infer.py, openai.py, anthropic.py, responses.py, embeddings.py)
   parses the body once into its typed request and builds a :class:`Call`: the model name, the
   :class:`~llmman.cluster.router.Intent`, and its local serving step.
2. :func:`run` asks the router (cluster/router.py) where the request runs.
3. Forward: the original bytes go to each target peer in turn (cluster/forward.py); one that fails
   before its status line is marked down and the next is tried; the first that answers is streamed back
   as it comes (api/relay.py :class:`~llmman.api.relay.PeerAnswer`).
4. Local: the model is ensured in the store (:meth:`Gateway.ensure`: copied from the peer the router
   named, or pulled; the same for every route — an unload or ``/api/show`` only looks in the store), then
   the call's serving step checks capabilities, applies defaults, opens the lease and relays the child's
   answer through the dialect's transducer (api/relay.py :func:`~llmman.api.relay.stream_answer`).

Errors before the first byte are raised as :class:`~llmman.errors.LlmmanError` and rendered in the
route's dialect by api/errors.py; after it, the transducer's in-band frame ends the stream. See
docs/architecture.md.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.cancel import unless_disconnected
from llmman.api.relay import PeerAnswer
from llmman.api.services import Services
from llmman.cluster.forward import forward_headers, open_forward
from llmman.cluster.peers import HOP
from llmman.cluster.router import Forward, Intent, Local, Origin, Target
from llmman.cluster.source import SOURCE, SOURCE_DIGEST
from llmman.gateway import ResolvedModel
from llmman.protocol.errors import dialect_of, error_frame

log = logging.getLogger("llmman.api.inference")

Serve = Callable[[ResolvedModel], Awaitable[Response]]


@dataclass(frozen=True)
class Call:
    """One parsed inference request, as the pipeline sees it.

    Attributes:
        model: the model name as the client sent it.
        serve: the dialect's local serving step, given the model found in (or fetched into) the store.
        intent: what the request wants of the model (an unload, a show, or anything else).
        conversation: the conversation key of a chat (llmman.protocol.conversation), for affinity.
    """

    model: str
    serve: Serve
    intent: Intent = Intent.INFER
    conversation: str | None = None


def origin(request: Request) -> Origin:
    """What placement needs to know of where ``request`` came from."""
    headers = request.headers
    return Origin(hop=HOP in headers, source=headers.get(SOURCE), digest=headers.get(SOURCE_DIGEST),
                  client_host=request.client.host if request.client else None)


async def run(request: Request, call: Call) -> Response:
    """Serve ``call`` where the router decides: forwarded to a peer, or here.

    Raises:
        LlmmanError: before the first byte (e.g. ModelNotFound, BadRequest from the serving step).
    """
    services: Services = request.app.state.services
    router = services.router
    where = origin(request)
    decision = await router.decide(call.model, call.intent, where, conversation=call.conversation)
    while isinstance(decision, Forward):
        for target in decision.targets:
            answer = await _forward(request, services, target, call.model)
            if answer is not None:
                return answer
        decision = decision.otherwise or await router.decide(call.model, call.intent, where, fresh=True,
                                                             conversation=call.conversation)
    return await call.serve(await _ensure(services, call, decision))


async def _ensure(services: Services, call: Call, decision: Local) -> ResolvedModel:
    """The model in this node's store: fetched when missing unless the call only looks (unload, show)."""
    if call.intent is Intent.INFER:
        return await services.gateway.ensure(call.model, decision.source)
    return services.gateway.resolve(call.model)


async def _forward(request: Request, services: Services, target: Target, model: str) -> Response | None:
    """``request``'s bytes sent to ``target``: its answer, or None when it failed or stayed silent for
    ``server.load_timeout`` before answering (nothing was sent to the client)."""
    peers, router = services.peers, services.router
    assert peers is not None
    path = request.url.path
    path_qs = path + (f"?{request.url.query}" if request.url.query else "")
    client_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
    body = await request.body()
    opening = open_forward(peers, target.address, request.method, path_qs, body,
                           forward_headers(client_headers, peers, target.source, target.digest),
                           read_timeout=services.settings.load_timeout)
    try:
        # A client that goes away before the peer's status line (a non-streamed answer arrives whole)
        # cancels the forward, which closes the connection and so the work on the peer (499).
        response = await unless_disconnected(request, opening)
    except (OSError, aiohttp.ClientError, TimeoutError) as exc:
        router.failed(target, str(exc) or type(exc).__name__)
        return None
    log.debug("forwarding %s to %s", path, target.name)
    router.answered(model, response.status)
    dialect = dialect_of(path)
    return PeerAnswer(response, lambda message: error_frame(dialect, message, 502),
                      lambda why: router.failed(target, why), target.name)
