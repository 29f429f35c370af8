"""The client of ``/llmman/rpc/workers`` (llmman.cluster.lenders) against a lender that injects faults.

The lender here is a stand-in (an aiohttp app with the contract's routes: docs/split.md) so that a test can
make it refuse a lease (507), lose a worker (renew answers 404) or stop answering; the real routes are
exercised by tests/integration/test_rpc_workers.py and tests/integration/test_split.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from llmman.cluster.lenders import Leases, lease_workers
from llmman.cluster.split import Share
from llmman.errors import LlmmanError


@dataclass
class FaultyLender:
    """A lender: ``refuse`` answers the lease with that status; ``lose`` answers renewals 404."""

    lease: float = 0.3
    refuse: int | None = None
    lose: bool = False
    workers: dict[str, int] = field(default_factory=dict)
    renewals: int = 0
    deleted: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/llmman/rpc/workers", self.create)
        app.router.add_post("/llmman/rpc/workers/{id}/renew", self.renew)
        app.router.add_delete("/llmman/rpc/workers/{id}", self.delete)
        return app

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        assert request.headers.get("Authorization") == "Bearer k"
        if self.refuse is not None:
            return web.json_response({"error": "no room"}, status=self.refuse)
        ident = f"w{len(self.workers)}"
        self.workers[ident] = body["memory"]
        return web.json_response({"id": ident, "endpoint": f"127.0.0.1:{5000 + len(self.workers)}",
                                  "memory": body["memory"], "lease": self.lease}, status=201)

    async def renew(self, request: web.Request) -> web.Response:
        self.renewals += 1
        if self.lose or request.match_info["id"] not in self.workers:
            return web.json_response({"error": "worker_gone"}, status=404)
        return web.json_response({"lease": self.lease})

    async def delete(self, request: web.Request) -> web.Response:
        ident = request.match_info["id"]
        self.deleted.append(ident)
        return web.json_response({"stopped": self.workers.pop(ident, None) is not None})


@pytest.fixture
async def lender() -> AsyncIterator[tuple[FaultyLender, str]]:
    fake = FaultyLender()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"http://127.0.0.1:{port}"
    await runner.cleanup()


KEY = {"Authorization": "Bearer k"}


def share(url: str, memory: int = 100) -> Share:
    return Share("b:1", url, "bravo", 3, memory)


async def wait_for(condition: Callable[[], bool], what: str, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def test_lease_renew_release(lender: tuple[FaultyLender, str]) -> None:
    fake, url = lender
    ended: list[bool] = []
    async with aiohttp.ClientSession() as session:
        leases = await lease_workers(session, {"Authorization": "Bearer k"}, [share(url, 123)], owner="me",
                                     model="m:1", ended=lambda: ended.append(True))
        assert fake.workers == {"w0": 123} and leases.endpoints == ("127.0.0.1:5001",)
        # renewed from the moment it is lent, before anyone watches (the child's load takes a while)
        await wait_for(lambda: fake.renewals >= 2, "two renewals")
        assert not leases.spent
        await leases.release()
        await leases.release()  # idempotent
        assert leases.spent and ended == [True] and fake.deleted == ["w0"] and not fake.workers
        task = leases._task
        assert task is not None
        with contextlib.suppress(asyncio.CancelledError):
            await task  # the renewals stopped with the release
        assert task.cancelled()


async def test_a_404_renewal_is_a_lost_worker(lender: tuple[FaultyLender, str]) -> None:
    fake, url = lender
    lost: list[str] = []
    async with aiohttp.ClientSession() as session:
        leases = await lease_workers(session, KEY, [share(url)], owner="me", model="m:1")
        fake.lose = True
        await wait_for(lambda: fake.renewals >= 1, "a renewal")
        leases.watch(lost.append)  # lost before the watch: told at once
        await wait_for(lambda: bool(lost), "the loss")
        assert lost == ["the RPC worker on b:1 (127.0.0.1:5001) is gone"]
        await leases.release()


async def test_a_lender_that_stops_answering_is_lost_after_a_lease(lender: tuple[FaultyLender, str]) -> None:
    fake, url = lender
    lost: list[str] = []
    async with aiohttp.ClientSession() as session:
        leases = await lease_workers(session, KEY, [share(url)], owner="me", model="m:1")
        leases.watch(lost.append)
        await wait_for(lambda: fake.renewals >= 1, "a renewal")
        leases.workers = tuple(type(w)(w.node, "http://127.0.0.1:9", w.id, w.endpoint, w.memory, w.lease)
                               for w in leases.workers)  # the lender's address stops answering
        await wait_for(lambda: bool(lost), "the loss")
        assert "has not renewed its RPC worker for 0.3 s" in lost[0]
        await leases.release()


async def test_a_refusal_releases_the_others_and_keeps_507(lender: tuple[FaultyLender, str]) -> None:
    fake, url = lender
    refusing = FaultyLender(refuse=507)
    runner = web.AppRunner(refusing.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    other = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(LlmmanError) as caught:
                await lease_workers(session, {"Authorization": "Bearer k"}, [share(url), share(other)],
                                    owner="me", model="m:1")
        assert caught.value.status == 507 and "no room" in caught.value.message
        assert fake.deleted == ["w0"] and not fake.workers  # the worker that was lent is released
    finally:
        await runner.cleanup()


async def test_an_unreachable_lender_is_503() -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(LlmmanError) as caught:
            await lease_workers(session, {}, [share("http://127.0.0.1:9")], owner="me", model="m:1")
    assert caught.value.status == 503 and "did not lend an RPC worker" in caught.value.message


async def test_leases_without_workers_do_nothing() -> None:
    async with aiohttp.ClientSession() as session:
        leases = Leases(session, {}, [])
        leases.start()
        assert leases.endpoints == () and not leases.spent
        await leases.release()
        assert leases.spent
