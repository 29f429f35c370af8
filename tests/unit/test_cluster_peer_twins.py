"""One node at two addresses (cluster/peers.py): a peer whose ``/llmman/node`` carries another peer's node
id is that peer again (a node bound to every address, a dual-stack pod) and is left out while the other's
address is in the set; when that address goes, it is the node's address again. Against one real aiohttp
node listening on two loopback addresses."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from llmman.cluster.peers import Peers, peer_name
from llmman.config.table import HostAddress


@pytest.fixture()
async def node() -> AsyncIterator[tuple[HostAddress, HostAddress]]:
    async def document(_: web.Request) -> web.Response:
        return web.json_response({"memory": 1000, "loaded": {}, "stored": {}, "name": "n2", "id": "node-2"})

    app = web.Application()
    app.router.add_get("/llmman/node", document)
    runner = web.AppRunner(app)
    await runner.setup()
    first = web.TCPSite(runner, "127.0.0.2", 0)
    await first.start()
    port = runner.addresses[0][1]
    await web.TCPSite(runner, "127.0.0.3", port).start()
    yield HostAddress("http", "127.0.0.2", port), HostAddress("http", "127.0.0.3", port)
    await runner.cleanup()


async def test_a_node_at_two_addresses_is_one_peer(node: tuple[HostAddress, HostAddress]) -> None:
    a, b = node
    async with aiohttp.ClientSession() as session:
        peers = Peers(session, (a, b), timeout=5.0)
        views = await peers.probe()
        assert len(views) == 1 and len(peers.addresses) == 1, (views, peers.addresses)
        kept = peers.addresses[0]
        other = b if kept == a else a
        assert [s.address for s in peers.states()] == [kept]
        assert [v.name for v in await peers.probe()] == [peer_name(kept)]
        peers.update((a, b))  # the same set again (a DNS refresh): still one
        assert peers.addresses == (kept,)
        peers.update((other,))  # the address it was kept for is gone: the node is seen at the other
        assert peers.addresses == (other,)
        assert [v.name for v in await peers.probe()] == [peer_name(other)]
        await peers.close()


async def test_two_nodes_with_their_own_ids_are_two_peers(node: tuple[HostAddress, HostAddress]) -> None:
    """The control: documents without a shared id keep both addresses (here: no id at all)."""
    async def document(_: web.Request) -> web.Response:
        return web.json_response({"memory": 1000, "loaded": {}, "stored": {}, "name": "other"})

    app = web.Application()
    app.router.add_get("/llmman/node", document)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.4", 0).start()
    c = HostAddress("http", "127.0.0.4", runner.addresses[0][1])
    try:
        async with aiohttp.ClientSession() as session:
            peers = Peers(session, (node[0], c), timeout=5.0)
            assert len(await peers.probe()) == 2 and peers.addresses == (node[0], c)
            await peers.close()
    finally:
        await runner.cleanup()
