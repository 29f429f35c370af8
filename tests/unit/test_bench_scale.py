"""bench_scale.py's own parts that need no root: the loss classifier's bytecode (bench/scale_net.py) and the
delaying relay (bench/scale_delay.py), the latter against a real aiohttp server on loopback: what it relays
arrives whole and in order, and it counts probes and other requests apart."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import aiohttp
import pytest
from aiohttp import web

BENCH = Path(__file__).resolve().parents[2] / "bench"
DEADLINE_S = 10.0


def load(name: str) -> ModuleType:
    """A module of bench/ by file name (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


scale_net = load("scale_net")
scale_delay = load("scale_delay")


def test_the_loss_program_draws_a_random_word_and_drops_below_the_threshold() -> None:
    program = scale_net.rand_program(0.001)
    count, *ops = program.split(",")
    assert int(count) == len(ops) == 4
    assert ops[0] == f"32 0 0 {2**32 - 0x1000 + 56}"  # ld rand (SKF_AD_OFF + SKF_AD_RANDOM)
    assert ops[1] == f"53 1 0 {round(0.001 * 2**32)}"  # jge: at or above the threshold skips the drop
    assert ops[2] == "6 0 0 65568"  # ret 1:20, the class whose bfifo of limit 0 drops
    assert ops[3] == "6 0 0 0"  # ret 0: no match, the default class
    assert scale_net.rand_program(1.0).split(",")[2] == f"53 1 0 {2**32 - 1}"
    assert scale_net.rand_program(0.0).split(",")[2] == "53 1 0 0"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def read_stats(path: Path) -> dict[str, float]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


async def test_the_relay_passes_every_byte_in_order_and_counts_probes_apart(tmp_path: Path) -> None:
    async def node(request: web.Request) -> web.Response:
        return web.json_response({"name": "n1", "stored": {}})

    async def stream(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        answer = web.StreamResponse()
        await answer.prepare(request)
        for i in range(200):
            await answer.write(b"%d:" % i + body[:10] + b"\n")
        await answer.write_eof()
        return answer

    app = web.Application()
    app.router.add_get("/llmman/node", node)
    app.router.add_post("/api/generate", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    target, listen = free_port(), free_port()
    await web.TCPSite(runner, "127.0.0.1", target).start()
    stats = tmp_path / "relay.json"
    relay = asyncio.ensure_future(scale_delay.serve(("127.0.0.1", listen), ("127.0.0.1", target), 0.001, 0.05,
                                                    str(stats)))
    try:
        url = f"http://127.0.0.1:{listen}"
        await until(lambda: stats.exists(), "the relay to write its counters")
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/llmman/node") as resp:
                assert resp.status == 200
                assert (await resp.json())["name"] == "n1"
            async with session.post(url + "/api/generate", data=b"0123456789abcdef") as resp:
                lines = (await resp.read()).decode().splitlines()
        assert lines == [f"{i}:0123456789" for i in range(200)]
        await until(lambda: read_stats(stats).get("other_requests") == 1, "the POST to be counted")
        counted = read_stats(stats)
        assert counted["probe_requests"] == 1
        assert counted["probe_bytes_out"] > 0 and counted["other_bytes_out"] > counted["probe_bytes_out"]
        assert counted["delay_ms"] == pytest.approx(1.0)
    finally:
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        await runner.cleanup()
