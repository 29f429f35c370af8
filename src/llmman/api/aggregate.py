"""ASGI middleware putting this node in its aggregation (SPEC G; rules in cluster/placement.py).

* A request carrying ``x-llmman-hop`` is this node's alone: served here, lists answered for this node
  only. Its ``x-llmman-source`` header names the peer to copy a missing model from, and is honoured
  only when it resolves to one of this node's configured peers (cluster/source.py); ``*`` there is
  resolved by the connection's source address, else by asking the peers which one stores the model.
* ``GET /api/ps``, ``/api/tags``, ``/v1/models`` merge the peers' answers (cluster/views.py).
* An inference ``POST`` (and ``/api/show``) naming a model not loaded here probes the peers, ranks
  the nodes and serves it here or forwards the same bytes to the chosen peer, streaming its answer
  back as it comes. A peer that fails (or stays silent ``server.load_timeout``) before its status line is
  marked down and the next candidate is tried; a failure or a stall as long after it ends the stream
  with an in-band error. A client that goes away closes
  the upstream connection, which cancels the work on the peer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import aiohttp
import orjson
from starlette.datastructures import Headers

from llmman.api.services import Services
from llmman.cluster.copy import PULL_SOURCE, PullSource
from llmman.cluster.forward import RESPONSE_DROP, forward_headers, in_band_error, open_forward
from llmman.cluster.peers import HOP, Peers, local_view, peer_name
from llmman.cluster.placement import NodeView, model_size, rank
from llmman.cluster.source import SOURCE, SOURCE_DIGEST, configured_source, source_digest, storing_peer
from llmman.cluster.views import MERGED, merge
from llmman.config.table import HostAddress
from llmman.errors import LlmmanError
from llmman.refs import parse_reference

log = logging.getLogger("llmman.cluster")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PLACED = frozenset({
    "/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/show", "/v1/chat/completions",
    "/v1/completions", "/v1/embeddings", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses",
    "/v1/responses/input_tokens",
})


class Aggregate:
    """The middleware; a no-op on a node without peers (except honouring ``x-llmman-source``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        services: Services = scope["app"].state.services
        peers = services.peers
        headers = Headers(scope=scope)
        path, method = scope["path"], scope["method"]
        if HOP in headers or peers is None or not peers:
            if HOP in headers and SOURCE in headers and peers:
                return await self._hop(scope, receive, send, services, peers)
            return await self.app(scope, receive, send)
        if method == "GET" and path in MERGED:
            return await self._view(scope, receive, send, peers)
        if method == "POST" and path in PLACED:
            return await self._place(scope, receive, send, services, peers)
        return await self.app(scope, receive, send)

    async def _hop(self, scope: Scope, receive: Receive, send: Send, services: Services,
                   peers: Peers) -> None:
        """A forwarded request naming where to copy its model from: only ever a configured peer."""
        headers = Headers(scope=scope)
        value, digest = headers[SOURCE], source_digest(headers.get(SOURCE_DIGEST))
        client = scope.get("client")
        address = configured_source(value, str(client[0]) if client else None, peers.addresses)
        if address is None and "*" in value:  # the forwarder stores it; find it among our peers
            body = await _read_body(receive)
            receive = _replay(body, receive)
            ref = _model_of(scope["path"], body, services.settings.aliases)
            if ref is not None and services.store.find(parse_reference(ref)) is None:
                log.info("%s %r names no configured peer: asking the peers which one stores %s",
                         SOURCE, value, ref)
                address = storing_peer(ref, await peers.probe(), peers.addresses)
        if address is not None:
            PULL_SOURCE.set(PullSource(address, peers.api_key, digest))
        return await self.app(scope, receive, send)

    async def _view(self, scope: Scope, receive: Receive, send: Send, peers: Peers) -> None:
        messages: list[Message] = []

        async def capture(message: Message) -> None:
            messages.append(message)

        remote_task = asyncio.ensure_future(peers.gather(scope["path"]))
        await self.app(scope, receive, capture)
        remote = await remote_task
        start = messages[0] if messages else {}
        body = b"".join(m.get("body", b"") for m in messages[1:])
        if start.get("status") == 200 and remote:
            try:
                body = orjson.dumps(merge(scope["path"], orjson.loads(body),
                                          [(peer_name(a), doc) for a, doc in remote]))
            except orjson.JSONDecodeError:
                pass
        out = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        out.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": start.get("status", 500), "headers": out})
        await send({"type": "http.response.body", "body": body})

    async def _place(self, scope: Scope, receive: Receive, send: Send, services: Services,
                     peers: Peers) -> None:
        body = await _read_body(receive)
        replay = _replay(body, receive)
        ref = _model_of(scope["path"], body, services.settings.aliases)
        if ref is None:
            return await self.app(scope, replay, send)
        if _loaded_here(services, ref):
            return await self.app(scope, replay, send)
        unload = _is_unload(scope["path"], body)
        if unload or scope["path"] == "/api/show":
            peers.recent.forget(ref)
        elif await self._recent(scope, receive, send, peers, ref, body, services.settings.load_timeout):
            return None
        nodes = [local_view(services.scheduler, services.store), *await peers.probe()]
        candidates = _candidates(scope["path"], unload, ref, nodes)
        log.debug("placement of %s: %s (free/memory: %s)", ref, [n.name for n in candidates],
                  {n.name: f"{n.free}/{n.memory}" for n in nodes})
        if not unload and candidates[0].has_loaded(ref) and not candidates[0].is_local:
            peers.recent.put(ref, _address(peers, candidates[0]))
        storer = next((n for n in nodes if n.has_stored(ref)), None)
        for node in candidates:
            if node.is_local:
                if storer is not None and not storer.is_local:
                    PULL_SOURCE.set(PullSource(_address(peers, storer), peers.api_key))
                return await self.app(scope, replay, send)
            source, digest = None, ""
            if storer is not None and not node.has_stored(ref):
                source = storer.url
                if storer.is_local:  # the peer resolves "*" (it knows us by another name than our own)
                    own = services.settings.host
                    source = f"{own.scheme}://*:{own.port}"
                    mine = services.store.find(parse_reference(ref))
                    digest = mine.digest if mine is not None else ""
            if await self._forward(scope, receive, send, peers, _address(peers, node), body,
                                   (source, digest), ref, services.settings.load_timeout):
                return None
        return await self.app(scope, replay, send)

    async def _recent(self, scope: Scope, receive: Receive, send: Send, peers: Peers, ref: str,
                      body: bytes, silence_s: float) -> bool:
        """Forward to the peer a probe saw ``ref`` loaded on moments ago, skipping a new probe (see
        cluster/recent.py); False when there is none or it failed before answering (it is forgotten)."""
        seen = peers.recent.get(ref)
        if seen is None or seen[0] not in peers.up():
            return False
        address, age = seen
        log.debug("placement of %s: %s (loaded there, probed %.1f s ago)", ref, peer_name(address), age)
        if await self._forward(scope, receive, send, peers, address, body, (None, ""), ref, silence_s):
            return True
        peers.recent.forget(ref)
        return False

    async def _forward(self, scope: Scope, receive: Receive, send: Send, peers: Peers, address: HostAddress,
                       body: bytes, source: tuple[str | None, str], ref: str, silence_s: float) -> bool:
        """Serve the request from the peer at ``address``; False when it failed or stayed silent
        ``silence_s`` seconds before answering (nothing was sent). ``source`` is the copy source and its
        manifest digest. An error status from the peer drops what :attr:`Peers.recent` knows of ``ref``."""
        path_qs = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        client_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        try:
            response = await open_forward(peers, address, scope["method"], path_qs, body,
                                          forward_headers(client_headers, peers, *source),
                                          read_timeout=silence_s)
        except (OSError, aiohttp.ClientError, TimeoutError) as exc:
            peers.mark_down(address, str(exc) or type(exc).__name__)
            return False
        log.debug("forwarding %s to %s", scope["path"], peer_name(address))
        if response.status >= 400:
            peers.recent.forget(ref)
        pump = asyncio.ensure_future(_pump(response, send, scope["path"], peers, address))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, watch):
                task.cancel()
            await asyncio.gather(pump, watch, return_exceptions=True)
            # An answer read to its end has already given its keep-alive connection back to the pool
            # (aiohttp does at EOF), so this only closes a connection cut short, cancelling the peer's work.
            response.close()
        return True


async def _pump(response: aiohttp.ClientResponse, send: Send, path: str, peers: Peers, address: Any) -> None:
    """Stream the peer's answer to the client as it comes; a break ends it with an in-band error."""
    headers = [(k, v) for k, v in response.raw_headers if k.decode("latin-1").lower() not in RESPONSE_DROP]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    try:
        async for chunk in response.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        what = "stalled" if isinstance(exc, TimeoutError) else "failed"  # timeout: no byte for load_timeout
        peers.mark_down(address, f"{what} mid-answer: {exc or type(exc).__name__}")
        message = f"peer {peer_name(address)} {what} mid-answer"
        await send({"type": "http.response.body", "body": in_band_error(path, message), "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def _model_of(path: str, body: bytes, aliases: dict[str, str]) -> str | None:
    """The full reference the request names, or None (no JSON, no model: served here)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    name = doc.get("model") or (doc.get("name") if path == "/api/show" else None) if isinstance(doc, dict) \
        else None
    if not isinstance(name, str) or not name:
        return None
    try:
        return str(parse_reference(name, aliases))
    except LlmmanError:
        return None


def _is_unload(path: str, body: bytes) -> bool:
    """True for an Ollama unload (``keep_alive`` 0 on generate or chat)."""
    if path not in ("/api/generate", "/api/chat"):
        return False
    doc = orjson.loads(body)
    return isinstance(doc, dict) and doc.get("keep_alive") in (0, "0", "0s", "0m")


def _loaded_here(services: Services, ref: str) -> bool:
    """True when this node has ``ref`` loaded (or loading); cheaper than :func:`local_view`."""
    key = ref.lower()
    return any(snap.reference.lower() == key for snap in services.scheduler.snapshot())


def _address(peers: Peers, node: NodeView) -> HostAddress:
    return next(a for a in peers.addresses if peer_name(a) == node.name)


def _candidates(path: str, unload: bool, ref: str, nodes: list[NodeView]) -> list[NodeView]:
    """Where to try, in order: show and unload go where the model is; anything else by the rules."""
    if path == "/api/show":
        return [n for n in nodes if n.has_stored(ref)] or nodes[:1]
    if unload:
        return [n for n in nodes if n.has_loaded(ref)] or nodes[:1]
    return rank(ref, model_size(ref, nodes), nodes)
