"""A loaded split asked for more than it was planned with (llmman.gateway.Gateway._split,
llmman.sched.plan.outgrown): as the scheduler does for an unsplit child, a context at least as large (and
the same load options) is served by it; a larger one, or other load options, plans it again when it is
idle — new workers leased, the old ones released first, so that their memory counts as room — and while it
is busy it serves the request as it is.

The lender is a stand-in (an aiohttp app with ``/llmman/node`` and the ``/llmman/rpc/workers`` routes of
docs/split.md whose reservation is what it lent), the child a stub behind the real SplitRunner; the real
daemons do the same in tests/integration/test_split.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from tests.fakes.inprocess import make_store
from tests.fakes.runner import StubRunner

from llmman.cluster.peers import Peers
from llmman.cluster.split_runner import SplitRunner
from llmman.config.table import HostAddress
from llmman.gateway import Gateway
from llmman.protocol.ollama.fields import RunnerOptions
from llmman.sched.gpu import NodeMemory
from llmman.sched.plan import ModelPlan, Runner, outgrown
from llmman.sched.scheduler import Scheduler

# the tiny model (one layer, trained on 2048 tokens): its head is 1 610 880 B whatever the context, its layer
# 80 128 B at 1024 tokens and 145 664 B at 2048, a worker's compute buffer 1 474 560 B
HERE = 1_620_880  # holds the head, not the layer: the model is split, the layer goes to the lender
THERE = 1_650_000  # a worker at either context, but not two at once


@dataclass
class Lender:
    """A lending peer whose free memory is ``memory`` minus the workers it lent now."""

    memory: int = THERE
    workers: dict[str, int] = field(default_factory=dict)
    lent: int = 0
    deleted: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/llmman/node", self.node)
        app.router.add_post("/llmman/rpc/workers", self.create)
        app.router.add_post("/llmman/rpc/workers/{id}/renew", self.renew)
        app.router.add_delete("/llmman/rpc/workers/{id}", self.delete)
        return app

    async def node(self, _: web.Request) -> web.Response:
        reserved = sum(self.workers.values())
        return web.json_response({"memory": self.memory, "loaded": {}, "stored": {}, "name": "bravo",
                                  "rpc": {"serve": True, "reserved": reserved, "workers": len(self.workers)}})

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["memory"] > self.memory - sum(self.workers.values()):
            return web.json_response({"error": "no room"}, status=507)
        ident = f"w{self.lent}"
        self.lent += 1
        self.workers[ident] = body["memory"]
        return web.json_response({"id": ident, "endpoint": f"127.0.0.1:{50100 + self.lent}",
                                  "memory": body["memory"], "lease": 30}, status=201)

    async def renew(self, request: web.Request) -> web.Response:
        if request.match_info["id"] not in self.workers:
            return web.json_response({"error": "worker_gone"}, status=404)
        return web.json_response({"lease": 30})

    async def delete(self, request: web.Request) -> web.Response:
        ident = request.match_info["id"]
        self.deleted.append(ident)
        return web.json_response({"stopped": self.workers.pop(ident, None) is not None})


def launcher(started: list[ModelPlan]) -> Callable[[ModelPlan, Callable[[Runner], None]], object]:
    """Children that are stubs; a split one wrapped in the real SplitRunner (its leases), as the daemon's."""
    async def launch(plan: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        started.append(plan)
        if plan.split is None or plan.split.workers is None:
            return StubRunner("http://127.0.0.1:1", None, on_exit)
        wrapper = SplitRunner(plan.split.workers, on_exit)
        wrapper.attach(StubRunner("http://127.0.0.1:1", None, wrapper.child_exited))
        return wrapper
    return launch


@contextlib.asynccontextmanager
async def split_pool(tmp: Path, node: NodeMemory | None = None, lender: Lender | None = None
                     ) -> AsyncIterator[tuple[Gateway, Lender, list[ModelPlan]]]:
    """A gateway on this node (``HERE`` bytes, or ``node``'s devices capped to it) with one lending peer
    (``lender``, else a :class:`Lender`); the plans its launcher started."""
    lender = lender if lender is not None else Lender()
    site_runner = web.AppRunner(lender.app())
    await site_runner.setup()
    site = web.TCPSite(site_runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    started: list[ModelPlan] = []
    sched = Scheduler(launcher(started), default_keep_alive=300,  # type: ignore[arg-type]
                      capacity=node.capacity if node else HERE, node_memory=node)
    async with aiohttp.ClientSession() as session:
        gw = Gateway(make_store(tmp, ("tiny",)), sched, session, context_length=1024, aliases={})
        gw.peers = Peers(session, (HostAddress("http", "127.0.0.1", port),), timeout=5.0)
        try:
            yield gw, lender, started
        finally:
            await sched.close()
            await site_runner.cleanup()


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[tuple[Gateway, Lender, list[ModelPlan]]]:
    async with split_pool(tmp_path) as made:
        yield made


async def test_a_larger_context_plans_the_split_again_with_new_workers(
        pool: tuple[Gateway, Lender, list[ModelPlan]]) -> None:
    gw, lender, started = pool
    model = gw.resolve("tiny")
    (await gw.acquire(model, keep_alive=None, num_ctx=None)).release()
    assert [p.n_ctx for p in started] == [1024] and started[0].split is not None
    assert set(lender.workers) == {"w0"}
    (await gw.acquire(model, keep_alive=None, num_ctx=512)).release()  # a smaller context: the same split
    assert len(started) == 1 and set(lender.workers) == {"w0"}
    # twice the context: the idle split is unloaded, w0 released, and only then w1 fits on the lender
    (await gw.acquire(model, keep_alive=None, num_ctx=2048)).release()
    assert [p.n_ctx for p in started] == [1024, 2048]
    assert lender.deleted == ["w0"] and set(lender.workers) == {"w1"}
    assert [s.n_ctx for s in gw.scheduler.snapshot()] == [2048]
    assert gw.split_of(started[1].key)[1][1] == lender.workers["w1"] > started[0].split.parts[1][1]


async def test_a_busy_split_serves_what_it_has_and_other_load_options_plan_it_again(
        pool: tuple[Gateway, Lender, list[ModelPlan]]) -> None:
    gw, lender, started = pool
    model = gw.resolve("tiny")
    held = await gw.acquire(model, keep_alive=None, num_ctx=None)
    assert gw.scheduler.snapshot()[0].refcount == 1
    # busy: served by the loaded split as it is (as the scheduler serves a busy unsplit child)
    other = RunnerOptions(num_thread=3)
    (await gw.acquire(model, keep_alive=None, num_ctx=2048)).release()
    assert len(started) == 1 and set(lender.workers) == {"w0"}
    held.release()
    (await gw.acquire(model, keep_alive=None, num_ctx=None, options=other)).release()  # idle now: again
    assert len(started) == 2 and started[1].load.threads == 3
    assert lender.deleted == ["w0"] and set(lender.workers) == {"w1"}


def test_outgrown_is_the_schedulers_reuse_rule() -> None:
    loaded = ModelPlan(reference="m:1", digest="d", size=1, n_ctx=1024)
    assert not outgrown(loaded, ModelPlan(reference="m:1", digest="d", size=1, n_ctx=1024))
    assert not outgrown(loaded, ModelPlan(reference="m:1", digest="d", size=1, n_ctx=512))
    assert outgrown(loaded, ModelPlan(reference="m:1", digest="d", size=1, n_ctx=2048))
    asked = ModelPlan(reference="m:1", digest="d", size=1, n_ctx=512, asked_gpu_layers=0)
    assert outgrown(loaded, asked)  # other load options, as llmman.sched.plan.reloads
