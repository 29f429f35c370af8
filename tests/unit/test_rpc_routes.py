"""``/llmman/rpc/workers`` (llmman.api.rpc_routes) through the daemon's app (build_app, its middleware and
error rendering) in this process, with a real scheduler and real ``ggml-rpc-server`` workers: the contract's
shapes and statuses (201, 200, 403, 404, 400, 507), the API key, and ``/llmman/node``'s ``rpc`` part."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import pytest
from tests.unit.test_rpc_lending import Launcher
from tests.unit.test_rpc_worker import gone, rpc_binary

from llmman.api.app import build_app
from llmman.api.services import Services
from llmman.cluster.state import parse_node
from llmman.config.settings import load_settings
from llmman.daemon import make_lending
from llmman.gateway import Gateway
from llmman.sched.scheduler import Scheduler
from llmman.store import Store

URL = "/llmman/rpc/workers"
KEY = "k" * 32


@dataclass
class App:
    client: httpx.AsyncClient
    scheduler: Scheduler
    services: Services


async def make_app(tmp_path: Path, env: dict[str, str]) -> AsyncIterator[App]:
    binary = rpc_binary()  # skips without one
    llama = str(Path(binary).parent / "llama-server")
    base = {"HOME": str(tmp_path), "LLMMAN_MODELS": str(tmp_path / "store"), "LLMMAN_HOST": "127.0.0.1:1",
            "LLMMAN_API_KEYS": KEY, "PATH": os.environ.get("PATH", "")}
    settings = load_settings(env=base | env, system_file=tmp_path / "none", user_file=tmp_path / "none")
    scheduler = Scheduler(Launcher(), default_keep_alive=300, capacity=1000)
    lending = make_lending(settings, scheduler, llama, {"PATH": os.environ.get("PATH", "")})
    store = Store(tmp_path / "store")
    async with aiohttp.ClientSession() as session:
        gateway = Gateway(store, scheduler, session, context_length=2048, aliases={})
        services = Services(settings=settings, store=store, scheduler=scheduler, gateway=gateway,
                            lending=lending)
        transport = httpx.ASGITransport(app=build_app(services), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://llmman.localhost",
                                     headers={"authorization": f"Bearer {KEY}"}, timeout=60) as client:
            try:
                yield App(client, scheduler, services)
            finally:
                await lending.close()
                await scheduler.close()


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[App]:
    async for a in make_app(tmp_path, {"LLMMAN_RPC_SERVE": "true", "LLMMAN_RPC_LEASE": "20s"}):
        yield a


@pytest.fixture
async def off(tmp_path: Path) -> AsyncIterator[App]:
    async for a in make_app(tmp_path, {}):
        yield a


async def test_lend_list_renew_delete(app: App) -> None:
    r = await app.client.post(URL, json={"owner": "n1", "model": "docker.io/ai/big:1", "memory": 600})
    assert r.status_code == 201, r.text
    body = r.json()
    assert set(body) == {"id", "endpoint", "memory", "lease"}
    assert body["memory"] == 600 and body["lease"] == 20.0 and body["endpoint"].startswith("127.0.0.1:")
    listing = (await app.client.get(URL)).json()
    assert listing["serve"] is True
    (row,) = listing["workers"]
    assert row["id"] == body["id"] and row["endpoint"] == body["endpoint"] and row["alive"] is True
    assert set(row) == {"id", "owner", "model", "memory", "endpoint", "alive", "expires_in"}
    node = (await app.client.get("/llmman/node")).json()
    assert node["rpc"] == {"serve": True, "reserved": 600, "workers": 1}
    assert node["free"] == 400 and node["loaded"] == {}
    view = parse_node("lender", "http://lender", node)  # as a peer's placement reads it (S's side)
    assert view is not None and view.lends and view.reserved == 600 and view.free == 400
    assert (await app.client.get("/api/ps")).json()["models"] == []  # a lent worker is not a model
    r = await app.client.post(f"{URL}/{body['id']}/renew")
    assert r.status_code == 200 and r.json() == {"lease": 20.0}
    assert app.services.lending is not None
    lent = app.services.lending.get(body["id"])
    assert lent is not None and lent.endpoint == body["endpoint"]
    pid = lent.worker.pid
    r = await app.client.delete(f"{URL}/{body['id']}")
    assert r.status_code == 200 and r.json() == {"stopped": True}
    assert pid is not None and gone(pid)
    r = await app.client.delete(f"{URL}/{body['id']}")
    assert r.status_code == 200 and r.json() == {"stopped": False}
    r = await app.client.post(f"{URL}/{body['id']}/renew")
    assert r.status_code == 404 and r.json()["error"].startswith("no RPC worker")
    node = (await app.client.get("/llmman/node")).json()
    assert node["rpc"] == {"serve": True, "reserved": 0, "workers": 0} and node["free"] == 1000


async def test_more_than_this_node_can_hold_is_507(app: App) -> None:
    r = await app.client.post(URL, json={"owner": "n1", "model": "m", "memory": 1001})
    assert r.status_code == 507 and "cannot lend" in r.json()["error"]
    assert (await app.client.get(URL)).json()["workers"] == []


@pytest.mark.parametrize("body", [
    b"", b"[]", b"{", b'{"memory": 0}', b'{"memory": -5}', b'{"memory": "100"}', b'{"memory": true}',
    b'{"memory": 1.5}', b'{"owner": 5, "memory": 10}', b'{"model": ["x"], "memory": 10}',
    b'{"owner": "' + b"x" * 2000 + b'", "memory": 10}',
])
async def test_bad_bodies_are_400(app: App, body: bytes) -> None:
    r = await app.client.post(URL, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert isinstance(r.json()["error"], str)
    assert app.scheduler.reserved == 0


async def test_serve_off_is_403(off: App) -> None:
    r = await off.client.post(URL, json={"owner": "n1", "model": "m", "memory": 10})
    assert r.status_code == 403 and "rpc.serve" in r.json()["error"]
    assert (await off.client.get(URL)).json() == {"serve": False, "workers": []}
    node = (await off.client.get("/llmman/node")).json()
    assert node["rpc"] == {"serve": False, "reserved": 0, "workers": 0}
    r = await off.client.post(f"{URL}/nope/renew")
    assert r.status_code == 404


async def test_the_routes_need_the_api_key(app: App) -> None:
    r = await app.client.post(URL, json={"memory": 10}, headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert app.scheduler.reserved == 0
