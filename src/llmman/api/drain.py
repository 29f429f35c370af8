"""``POST /llmman/drain``, ``POST /llmman/undrain`` and ``GET /llmman/drain``: a node's drain state.

A draining node (:meth:`llmman.sched.scheduler.Scheduler.drain`) unloads every model as soon as it is
idle, publishes ``state: draining`` in ``/llmman/node`` (so its peers place nothing new on it) and still
serves what reaches it; ``undrain`` ends it. ``llmman drain [NODE] [--wait]`` and ``llmman undrain
[NODE]`` (llmman.cli.commands_drain) call these routes; ``GET`` only reads the state (``--wait`` polls it).

Which node: the body's ``node`` (``{"node": "NAME"}``, optional) or, for ``GET``, ``?node=NAME``. Empty,
this node's name (``node.name``) or its own ``host:port`` mean this node. Another value is looked for
among the configured peers (their ``host:port`` or URL, else the ``name`` their ``/llmman/node``
reports) and the request is sent there with the peer headers; no such node is 404, and a name that
two peers report is 409 (name one by ``host:port``). A request that came
from a peer (``x-llmman-hop``) is this node's alone and is never sent on.

Answer::

    {"node": "spark", "state": "draining" | "serving", "in_flight": n, "loaded": n}

``in_flight`` counts the requests on the node (being served or waiting), ``loaded`` its models loaded,
loading or still stopping: a drained node shows 0 and 0.
"""

from __future__ import annotations

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.ollama_infer import json_response
from llmman.api.services import Services
from llmman.cluster.peers import HOP, PEER_DOCUMENT_MAX, Peers, peer_name, read_capped
from llmman.cluster.source import is_self
from llmman.cluster.state import DRAINING, SERVING
from llmman.config.table import HostAddress, parse_host
from llmman.errors import BadRequest, ConfigError, LlmmanError, NotFound

DRAIN, UNDRAIN = "/llmman/drain", "/llmman/undrain"


def drain_document(services: Services) -> dict[str, object]:
    """This node's answer: its name, state, requests on it and models it holds."""
    scheduler = services.scheduler
    snaps = scheduler.snapshot()
    return {"node": services.settings.node_name, "state": DRAINING if scheduler.draining else SERVING,
            "in_flight": sum(snap.refcount for snap in snaps), "loaded": len(snaps)}


async def drain(request: Request) -> Response:
    """``POST /llmman/drain``: put the node into draining."""
    return await _act(request, DRAIN)


async def undrain(request: Request) -> Response:
    """``POST /llmman/undrain``: the node serves (and places) again."""
    return await _act(request, UNDRAIN)


async def state(request: Request) -> Response:
    """``GET /llmman/drain?node=NAME``: the node's drain state, unchanged."""
    services: Services = request.app.state.services
    name = request.query_params.get("node", "").strip()
    if is_this_node(services, name):
        return json_response(drain_document(services))
    return await _send(services, await named_peer(request, services, name), "GET", DRAIN)


async def _act(request: Request, path: str) -> Response:
    services: Services = request.app.state.services
    name = _node_name(await request.body())
    if not is_this_node(services, name):
        return await _send(services, await named_peer(request, services, name), "POST", path)
    if path == DRAIN:
        services.scheduler.drain()
    else:
        services.scheduler.undrain()
    return json_response(drain_document(services))


def _node_name(raw: bytes) -> str:
    """The body's ``node`` ('' for an empty body or no ``node``).

    Raises:
        BadRequest: a body that is not a JSON object, or a ``node`` that is not a string.
    """
    if not raw.strip():
        return ""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"invalid JSON in request body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    node = body.get("node", "")
    if node is None:
        return ""
    if not isinstance(node, str):
        raise BadRequest("node must be a string: a node's name or host:port")
    return node.strip()


def _address(name: str) -> HostAddress | None:
    """``name`` read as ``[scheme://]host[:port]``, or None when it is not one."""
    try:
        return parse_host(name)
    except ConfigError:
        return None


def is_this_node(services: Services, name: str) -> bool:
    if not name or name == services.settings.node_name:
        return True
    address = _address(name)
    return address is not None and is_self(address, services.settings.host)


async def named_peer(request: Request, services: Services, name: str) -> HostAddress:
    """The peer named ``name``: by its configured address, else by the name it reports.

    Raises:
        NotFound: no peer of this node has that address or name (or the request came from a peer).
    """
    peers = services.peers
    if peers and HOP not in request.headers:
        wanted = _address(name)
        for address in peers.addresses:
            if peer_name(address) == name or (wanted is not None and is_self(wanted, address)):
                return address
        named = [address for address, doc in await peers.gather("/llmman/node")
                 if isinstance(doc, dict) and doc.get("name") == name]
        if len(named) > 1:  # two machines left at one default host name: never guess which to drain
            raise LlmmanError(f"{len(named)} nodes are named {name!r} "
                              f"({', '.join(peer_name(a) for a in named)}): name one by host:port",
                              status=409, code="ambiguous_node")
        if named:
            return named[0]
    raise NotFound(f"no node named {name!r} in this pool")


async def _send(services: Services, address: HostAddress, method: str, path: str) -> Response:
    """``method path`` on the peer at ``address`` for itself; its answer as it came.

    Raises:
        LlmmanError: 502 when the peer does not answer.
    """
    peers = services.peers
    assert isinstance(peers, Peers)
    timeout = aiohttp.ClientTimeout(total=max(peers.timeout, 10.0))
    try:
        async with peers.session.request(method, address.client_url() + path, headers=peers.headers(),
                                         timeout=timeout) as response:
            body, status = await read_capped(response, PEER_DOCUMENT_MAX), response.status
    except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise LlmmanError(f"node {peer_name(address)} did not answer: {str(exc) or type(exc).__name__}",
                          status=502, code="peer_failed") from exc
    return Response(body, status_code=status, media_type="application/json; charset=utf-8")
