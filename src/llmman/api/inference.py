"""The one inference pipeline: every inference route of every dialect goes through :func:`run`.

1. The dialect's route (api/ollama_infer.py, openai.py, anthropic.py, responses.py, embeddings.py)
   parses the body once into its typed request and builds a :class:`Call`: the model name, the
   :class:`~llmman.cluster.router.Intent`, and its local serving step.
2. :func:`run` asks the router (cluster/router.py) where the request runs.
3. Forward: the original bytes go to each target peer in turn (cluster/forward.py). Before the first
   byte every failure moves on to the next candidate, this node included, within the same request:
   a peer that cannot be reached, or stays silent and does not answer its probe, is marked down
   (:meth:`Router.failed`); one that answers 429 or any 5xx (busy, its load failed) is skipped, its answer
   read and dropped. A 4xx other than 429 is the client's own error and goes to it. When a decision's
   candidates are spent the router is asked again with the nodes tried (``tried``). The first answer is
   streamed back as it comes (api/relay.py :class:`~llmman.api.relay.PeerAnswer`).
4. Local: the model is ensured in the store (:meth:`Gateway.ensure`: copied from the peer the router
   named, or pulled; the same for every route — an unload or ``/api/show`` only looks in the store), then
   the call's serving step checks capabilities, applies defaults, opens the lease and relays the child's
   answer through the dialect's transducer (api/relay.py :func:`~llmman.api.relay.stream_answer`). A load
   that fails here (:func:`moves_on`) tries the peers too, unless the request came over a hop (the node
   that forwarded it fails over).

Every answer names the node that served it in ``x-llmman-node`` (:data:`~llmman.cluster.forward.NODE`);
an error names the node whose error it is. When every node failed, the client gets the last failure:
a peer's error answer (in the route's dialect) or this node's error.

Errors before the first byte are raised as :class:`~llmman.errors.LlmmanError` and rendered in the
route's dialect by api/errors.py; after it, the transducer's in-band frame ends the stream. See
docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.cancel import unless_disconnected
from llmman.api.errors import error_response, handle_llmman_error
from llmman.api.observed import Observed, Served
from llmman.api.relay import PeerAnswer
from llmman.api.services import Services
from llmman.cluster.forward import NODE, forward_headers, header_value, open_forward, works_on
from llmman.cluster.peers import HOP, PROBE_TIMEOUT_S
from llmman.cluster.placement import LOCAL
from llmman.cluster.router import Forward, Intent, Local, Origin, Target
from llmman.cluster.source import SOURCE, SOURCE_DIGEST
from llmman.errors import LlmmanError, RunnerError, ServiceUnavailable
from llmman.gateway import ResolvedModel
from llmman.obs.stopwatch import Stopwatch
from llmman.protocol.errors import error_frame, stream_dialect, upstream_text
from llmman.protocol.openai.shapes import upstream_message

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


#: The most of a refusing peer's error body read (the rest is dropped with its connection).
REFUSAL_BODY_MAX = 64 * 1024


def moves_on(exc: LlmmanError) -> bool:
    """True when this node failed to serve a request before its first byte in a way another node may
    not: the model would not load (a :class:`RunnerError`, ``insufficient_memory``) or this node cannot
    take it now (a 503: queue full, cooling down after a failed load, shutting down). A 4xx is the
    client's own error, a request refused because it crashed the model before would crash the next
    node's too, and a 507 says the whole pool lacks the memory (a split planned over every node,
    llmman.cluster.split.plan_split): another node would only copy the model to say the same."""
    if isinstance(exc, RunnerError):
        return True
    if exc.code == "request_crashed_model" or exc.status == 507:
        return False
    return exc.status == 503 or exc.code == "insufficient_memory"


def refused(status: int) -> bool:
    """True for a peer's answer that is its own failure, not the client's: 429, any 5xx but 507 (the whole
    pool lacks the memory: see :func:`moves_on`), and 401 (it does not accept our peer key; the client's
    key is never sent)."""
    return status in (401, 429) or (status >= 500 and status != 507)


async def run(request: Request, call: Call) -> Response:
    """Serve ``call`` where the router decides: forwarded to a peer, or here; the answer (an error too)
    carries ``x-llmman-node``."""
    services: Services = request.app.state.services
    watch = Stopwatch()
    where = origin(request)
    if where.hop:
        log.debug("%s %s forwarded by %r", request.method, request.url.path, request.headers.get(HOP))
    try:
        response = await _place(request, services, call, where)
    except LlmmanError as exc:
        response = await handle_llmman_error(request, exc)
    own = services.settings.node_name
    model = services.router.reference(call.model) or call.model
    if isinstance(response, PeerAnswer):
        served = Served(model, "forwarded", response.node, call.conversation)
    else:
        if NODE not in response.headers:
            response.headers[NODE] = header_value(own)
        served = Served(model, "hop" if where.hop else "local", response.headers.get(NODE) or own,
                        call.conversation)
    if not services.obs.active or call.intent is Intent.SHOW:
        # Observation off (metrics.collect and log.requests), or a description (/api/show) rather than a
        # request to the model: the answer as it is, unwatched, so stats count only model requests.
        return response
    return Observed(response, request, services.obs, watch, served)


async def _place(request: Request, services: Services, call: Call, where: Origin) -> Response:
    """Try the router's candidates in turn, asking it again (``tried``) when a decision is spent.

    Raises:
        LlmmanError: this node's error: a final one, or its load failure when nothing else answered.
    """
    router = services.router
    if call.intent is Intent.UNLOAD and not where.hop and services.peers:
        await _unload_copies(request, services, call.model)
    tried: set[str] = set()
    last: Response | LlmmanError | None = None
    decision = await router.decide(call.model, call.intent, where, conversation=call.conversation)
    while True:
        before = len(tried)
        local = decision if isinstance(decision, Local) else None
        if isinstance(decision, Forward):
            for target in decision.targets:
                if target.name in tried:
                    continue
                tried.add(target.name)
                answer = await _forward(request, services, target, call.model)
                if isinstance(answer, PeerAnswer):
                    if answer.status_code < 400:
                        router.served(call.conversation, target.name)
                    return answer
                last = answer if answer is not None else last
            local = decision.otherwise
        if local is not None and LOCAL not in tried:
            tried.add(LOCAL)
            try:
                response = await call.serve(await _ensure(services, call, local))
            except LlmmanError as exc:
                if where.hop or not services.peers or not moves_on(exc):
                    raise
                log.info("%s for %s failed here before its first byte (%s): trying the peers",
                         request.url.path, call.model, exc.message)
                last = exc
            else:
                if response.status_code < 400:
                    router.served(call.conversation, LOCAL)
                return response
        if len(tried) == before:  # nothing new was left to try
            break
        decision = await router.decide(call.model, call.intent, where, fresh=True, tried=frozenset(tried),
                                       conversation=call.conversation)
    if isinstance(last, LlmmanError):
        raise last
    if last is not None:
        return last
    raise ServiceUnavailable(f"no node could serve {call.model}")


async def _unload_copies(request: Request, services: Services, model: str) -> None:
    """A stop drains the model wherever it is: sent to every peer holding a copy, at once (the node the
    router names gets it as the answer; a second unload there only finds it draining or gone). What each
    peer answers is dropped; one that fails is logged."""
    async def one(target: Target) -> None:
        answer = await _forward(request, services, target, model)
        if isinstance(answer, PeerAnswer):
            await unless_disconnected(request, _drained(answer.upstream))
            answer.close()
        elif answer is not None:
            log.info("unload of %s on %s answered %d", model, target.name, answer.status_code)

    await asyncio.gather(*(one(t) for t in await services.router.copies_elsewhere(model)))


async def _ensure(services: Services, call: Call, decision: Local) -> ResolvedModel:
    """The model in this node's store: fetched when missing unless the call only looks (unload, show)."""
    if call.intent is Intent.INFER:
        return await services.gateway.ensure(call.model, decision.source)
    return services.gateway.resolve(call.model)


async def _forward(request: Request, services: Services, target: Target, model: str) -> Response | None:
    """``request``'s bytes sent to ``target``.

    Returns:
        its answer (:class:`PeerAnswer`, streamed as it comes: a success, or a 4xx that is the client's);
        a refusal (429, 5xx, 401: its error answer, read whole, for when nothing else answers);
        None when it failed or stayed silent before answering (marked down). Nothing was sent to the
        client unless it is a PeerAnswer.
    """
    peers, router, settings = services.peers, services.router, services.settings
    assert peers is not None
    path = request.url.path
    path_qs = path + (f"?{request.url.query}" if request.url.query else "")
    client_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
    body = await request.body()
    headers = forward_headers(client_headers, peers, target.source, target.digest, node=settings.node_name)
    ref = router.reference(model) or model
    opening = open_forward(peers, target.address, request.method, path_qs, body, headers,
                           read_timeout=settings.load_timeout, stall=settings.stall_timeout,
                           alive=lambda: works_on(peers, target.address, ref))
    # Counted from the first byte sent until the relayed answer ends (H3's optimistic accounting).
    counting = contextlib.ExitStack()
    counting.enter_context(peers.forwarding(target.address, ref))
    try:
        # A client that goes away before the peer's status line (a non-streamed answer arrives whole)
        # cancels the forward, which closes the connection and so the work on the peer (499).
        response = await unless_disconnected(request, opening)
    except (OSError, aiohttp.ClientError, TimeoutError) as exc:
        counting.close()
        why = str(exc) or type(exc).__name__
        log.info("forward of %s to %s failed before its first byte (%s): trying the next node", path,
                 target.name, why)
        router.failed(target, why)
        services.obs.metrics.forwarded(target.name, "failed")
        return None
    except BaseException:
        counting.close()
        raise
    router.answered(model, response.status)
    if refused(response.status):
        with counting:
            text = await unless_disconnected(request, _drained(response))
        if response.status == 401:
            router.failed(target, "it refused our peer key (401)")
        log.info("peer %s answered %s %d before its first byte: trying the next node", target.name, path,
                 response.status)
        services.obs.metrics.forwarded(target.name, "refused")
        return _refusal(path, response, text, target.name)
    log.debug("forwarding %s to %s", path, target.name)
    services.obs.metrics.forwarded(target.name, "ok")
    dialect = stream_dialect(path)

    def broke(why: str) -> None:
        router.failed(target, why)
        services.obs.metrics.forwarded(target.name, "broken")

    return PeerAnswer(response, lambda message: error_frame(dialect, message, 502), broke, target.name,
                      alive=lambda: works_on(peers, target.address, ref), stall=settings.stall_timeout,
                      finished=counting.close)


async def _drained(response: aiohttp.ClientResponse) -> bytes:
    """A refusing peer's error body (at most :data:`REFUSAL_BODY_MAX` bytes, within the probe timeout;
    what did not come is dropped), its connection released."""
    data = bytearray()
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            while len(data) < REFUSAL_BODY_MAX and (chunk := await response.content.read(REFUSAL_BODY_MAX)):
                data += chunk
    except (OSError, aiohttp.ClientError, TimeoutError):
        pass
    finally:
        response.release()
    return bytes(data)


def _refusal(path: str, response: aiohttp.ClientResponse, body: bytes, name: str) -> Response:
    """A peer's error answer as this node sends it on: an llmman peer's body is already in the route's
    dialect and goes as it is; anything else (a proxy's page) becomes the dialect's error with its text.
    ``Retry-After`` and the peer's ``x-llmman-node`` (else its name) are kept."""
    if upstream_message(body) is not None:
        answer = Response(body[:REFUSAL_BODY_MAX], status_code=response.status, media_type="application/json")
    else:
        answer = error_response(path, upstream_text(body), response.status)
    retry = response.headers.get("Retry-After")
    if retry:
        answer.headers["Retry-After"] = retry
    answer.headers[NODE] = response.headers.get(NODE) or header_value(name)
    return answer
