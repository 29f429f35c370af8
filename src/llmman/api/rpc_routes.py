"""``/llmman/rpc/workers``: the ``ggml-rpc-server`` workers this node lends to peers (docs/split.md).

Routes (behind the API keys like every other route; errors are ``{"error": "..."}`` with the status of the
llmman.errors class):

- ``POST /llmman/rpc/workers`` ``{"owner": node id, "model": reference, "memory": bytes}`` -> 201
  ``{"id", "endpoint": "host:port", "memory", "lease": seconds}`` once the worker listens; 403
  ``rpc_disabled`` (``rpc.serve`` off), 507 ``insufficient_memory``, 400 bad body, 503 no ggml-rpc-server.
- ``POST /llmman/rpc/workers/{id}/renew`` -> 200 ``{"lease": seconds}``; 404 ``worker_gone``.
- ``DELETE /llmman/rpc/workers/{id}`` -> 200 ``{"stopped": true}``, or ``false`` when it was gone.
- ``GET /llmman/rpc/workers`` -> ``{"serve": bool, "workers": [{"id", "owner", "model", "memory",
  "endpoint", "alive", "expires_in"}]}``.

The rules (leases, the reservation, the endpoint's host) are llmman.sched.lending.Lending's; these
handlers parse and answer. A node built without lending (tests) answers as one with ``rpc.serve`` off.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmman.api.ollama_infer import json_response
from llmman.api.services import Services
from llmman.cluster.lenders import RPC_WORKERS
from llmman.errors import BadRequest
from llmman.protocol.ollama.fields import parse_json_body
from llmman.sched.lending import Lending, RpcDisabled, WorkerGone

WORKERS = RPC_WORKERS  # the one spelling, which the lenders' client (llmman.cluster.lenders) calls
TEXT_MAX = 1024  # longest owner or model accepted


@dataclass(frozen=True)
class WorkerRequest:
    """A checked ``POST /llmman/rpc/workers`` body."""

    owner: str
    model: str
    memory: int


def worker_request(raw: bytes) -> WorkerRequest:
    """Parse a ``POST /llmman/rpc/workers`` body.

    Raises:
        BadRequest: not a JSON object, ``memory`` not a positive integer, ``owner`` or ``model`` not a
            string (both optional, at most :data:`TEXT_MAX` characters, no control characters: they go
            into the log's lines).
    """
    body = parse_json_body(raw)
    memory = body.get("memory")
    if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
        raise BadRequest("memory must be a positive integer (bytes)")
    texts = []
    for key in ("owner", "model"):
        value = body.get(key, "")
        if not isinstance(value, str) or len(value) > TEXT_MAX or not value.isprintable():
            raise BadRequest(f"{key} must be a string of at most {TEXT_MAX} printable characters")
        texts.append(value)
    return WorkerRequest(texts[0], texts[1], memory)


def _lending(request: Request) -> Lending | None:
    services: Services = request.app.state.services
    return services.lending


async def lend(request: Request) -> Response:
    """``POST /llmman/rpc/workers``."""
    lending = _lending(request)
    if lending is None or not lending.serve:
        raise RpcDisabled()
    wanted = worker_request(await request.body())
    server = request.scope.get("server")
    reach = str(server[0]) if server else ""
    lent = await lending.lend(wanted.owner, wanted.model, wanted.memory, reach=reach)
    return json_response({"id": lent.id, "endpoint": lent.endpoint, "memory": lent.memory,
                          "lease": lending.options.lease}, status=201)


async def renew(request: Request) -> Response:
    """``POST /llmman/rpc/workers/{id}/renew``."""
    lending = _lending(request)
    worker_id = request.path_params["id"]
    if lending is None:
        raise WorkerGone(worker_id)
    return json_response({"lease": lending.renew(worker_id)})


async def stop(request: Request) -> Response:
    """``DELETE /llmman/rpc/workers/{id}``."""
    lending = _lending(request)
    stopped = await lending.stop(request.path_params["id"]) if lending is not None else False
    return json_response({"stopped": stopped})


async def workers(request: Request) -> Response:
    """``GET /llmman/rpc/workers``."""
    lending = _lending(request)
    if lending is None:
        return json_response({"serve": False, "workers": []})
    return json_response({"serve": lending.serve, "workers": lending.listing()})


def rpc_routes() -> list[Route]:
    """The routes above, for the route table (llmman.api.app.build_app)."""
    return [
        Route(WORKERS, lend, methods=["POST"]),
        Route(WORKERS, workers, methods=["GET"]),
        Route(WORKERS + "/{id}/renew", renew, methods=["POST"]),
        Route(WORKERS + "/{id}", stop, methods=["DELETE"]),
    ]
