"""``GET /llmman/pool``: this node and every configured peer, as this node knows them (docs/aggregation.md,
"Seeing the pool").

Document::

    {"nodes": [{"name": "spark", "address": "10.0.0.7:17434", "self": true, "state": "up", "why": "",
                "unresponsive": false,
                "fallback": false, "version": "0.1.0", "last_seen": 0.0, "memory": bytes, "free": bytes,
                "models": {ref: {"slots": n, "in_flight": n, "queued": n, "loading": bool,
                                 "draining": bool, "size": bytes}},
                "stored": n, "rpc": {"serve": bool, "reserved": bytes, "workers": n},
                "forwarded": n}, ...]}

This node comes first (``"self": true``), then the peers in ``aggregation.peers`` order. ``state`` is
``up``, ``draining`` (up, taking no new placements) or ``down`` (with ``why``). The figures are the
peer's own, from its last good answer (``last_seen`` seconds ago, null when it never answered); a down
peer keeps its name and version from then but shows no memory, models or stored count, except an
*unresponsive* one (``"unresponsive": true``: it timed out, it did not refuse), which still holds what it
was last seen holding, so those figures stay (llmman answers 503 for its models, never 404). ``forwarded`` is
how many requests this node has open on that peer. The peers' figures come from the background refresh
(cluster/peers.py): a view is made without asking the peers again unless that state is stale.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from llmman import __version__
from llmman.api.listing import stored_listing
from llmman.api.ollama_infer import json_response
from llmman.api.services import Services
from llmman.cluster.peers import PeerState, peer_name
from llmman.cluster.placement import LOCAL, NodeView
from llmman.cluster.state import node_document, parse_node

UP, DOWN, DRAINING = "up", "down", "draining"


def node_entry(view: NodeView | None, *, name: str, address: str, own: bool, version: str,
               last_seen: float | None, down: str | None = None, forwarded: int = 0,
               unresponsive: bool = False) -> dict[str, Any]:
    """One node of the document (see the module docstring) from its last view (None: never seen)."""
    live = view if down is None or unresponsive else None
    sizes = {} if live is None else {ref.lower(): size for ref, size in live.loaded.items()}
    state = DOWN if down is not None else DRAINING if view is not None and view.draining else UP
    return {
        "name": view.node if view is not None and view.node else name,
        "address": address,
        "self": own,
        "state": state,
        "why": down or "",
        "unresponsive": down is not None and unresponsive,
        "fallback": view.fallback if view is not None else False,
        "version": version,
        "last_seen": None if last_seen is None else round(last_seen, 3),
        "memory": live.memory if live is not None else 0,
        "free": live.free if live is not None else 0,
        "models": {} if live is None else {
            ref: {"slots": m.slots, "in_flight": m.in_flight, "queued": m.queued, "loading": m.loading,
                  "draining": m.draining, "size": sizes.get(ref.lower(), 0)}
            for ref, m in live.models.items()},
        "stored": len(live.stored) if live is not None else 0,
        "rpc": {"serve": live.lends, "reserved": live.reserved, "workers": live.lent}
        if live is not None else {"serve": False, "reserved": 0, "workers": 0},
        "forwarded": forwarded,
    }


def peer_entry(state: PeerState) -> dict[str, Any]:
    """A configured peer's entry from what :class:`llmman.cluster.peers.Peers` knows of it."""
    seen = state.seen
    return node_entry(seen.view if seen else None, name="", address=peer_name(state.address), own=False,
                      version=seen.version if seen else "", last_seen=state.age, down=state.down,
                      forwarded=state.forwarded, unresponsive=state.unresponsive)


async def pool(request: Request) -> Response:
    """``GET /llmman/pool``."""
    services: Services = request.app.state.services
    settings = services.settings
    listing = await stored_listing(services)  # the kept listing: no manifest read on the event loop
    me = parse_node(LOCAL, "", node_document(services.scheduler, services.store, name=settings.node_name,
                                             fallback=settings.fallback, max_queue=0, stored=listing.sizes))
    assert me is not None  # our own document always parses
    nodes = [node_entry(me, name=settings.node_name, address=settings.host.netloc, own=True,
                        version=__version__, last_seen=0.0)]
    peers = services.peers
    if peers:
        await peers.current()  # asks the peers only when the background state is stale
        nodes += [peer_entry(state) for state in peers.states()]
    return json_response({"nodes": nodes})
