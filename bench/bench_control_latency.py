"""Benchmark: how long the control routes take while the data path is saturated (issue 17, target 3).

Usage (root): ``.venv/bin/python bench/bench_control_latency.py [--streams 256] [--seconds 10] [--keepalive]
[--phases idle,openai,ollama] [--samples-every 0.05] [--json OUT]``.

It starts a private ``llmman serve`` (own HOME, store and loopback port) whose llama-server is the fake
(``tests/fakes/fake_llama_server.py``: no per-token delay, so the streams are unpaced, and no slot limit;
``LLMMAN_NUM_PARALLEL`` is the stream count, so none of them counts as queued) storing one tiny synthetic
model. Then, for each phase, one client asks ``GET /api/version``, ``GET /health`` and ``GET /llmman/node``
(with ``x-llmman-hop``, as a peer's probe does) in turn, one request every ``--samples-every`` seconds, each
on a new connection, for ``--seconds``:

- ``idle``: nothing else runs;
- ``openai``: ``--streams`` clients each stream ``/v1/chat/completions`` (the passthrough) back to back, a
  2,000-token answer each;
- ``ollama``: the same on ``/api/chat`` (the SSE-to-NDJSON translation).

It prints, per phase and route, the median, 95th percentile and largest latency, and the tokens/s the
streams got. Timings are reported, never asserted; the exit status is non-zero only when the set-up or a
request failed. The CPUs are shared with whatever else runs: the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary  # noqa: E402
from tests.fakes.inprocess import make_store  # noqa: E402
from tests.integration.daemons import start_daemon  # noqa: E402

CONTROL = ("/api/version", "/health", "/llmman/node")
REPLY = " ".join(f"t{i}" for i in range(2000))


@dataclass
class RouteTimes:
    """One control route's latencies in one phase (milliseconds)."""

    route: str
    samples: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        ordered = sorted(self.samples)
        if not ordered:
            return {"n": 0, "p50": 0.0, "p95": 0.0, "max": 0.0}
        return {"n": len(ordered), "p50": statistics.median(ordered),
                "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], "max": ordered[-1]}


@dataclass
class Phase:
    name: str
    routes: dict[str, RouteTimes]
    tokens: int = 0
    seconds: float = 0.0
    errors: int = 0


async def streamer(session: aiohttp.ClientSession, url: str, route: str, tokens: Synchronized[int],
                   errors: Synchronized[int]) -> None:
    """Stream ``route`` back to back (until cancelled); count the lines (one per token) read."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    while True:
        try:
            async with session.post(url + route, json=body) as r:
                if r.status != 200:
                    errors.value += 1
                    await r.read()
                    continue
                n = 0
                async for _ in r.content:
                    n += 1
                    if n == 100:
                        tokens.value += n
                        n = 0
                tokens.value += n
        except (aiohttp.ClientError, OSError):
            errors.value += 1


def load(url: str, route: str, streams: int, tokens: Synchronized[int], errors: Synchronized[int]) -> None:
    """The load generator, in a process of its own (so its loop's lag is not the sampler's)."""
    async def main() -> None:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as s:
            await asyncio.gather(*(streamer(s, url, route, tokens, errors) for _ in range(streams)))

    asyncio.run(main())


async def sample(url: str, phase: Phase, seconds: float, every: float, keepalive: bool) -> None:
    """Ask the control routes in turn, each on a new connection (or, with ``keepalive``, all on one kept
    open), for ``seconds``; an answer that takes over a minute counts as 60,000 ms."""
    deadline = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=60)
    kept = aiohttp.ClientSession(timeout=timeout) if keepalive else None
    try:
        await _sample(url, phase, deadline, every, kept, timeout)
    finally:
        if kept is not None:
            await kept.close()


async def _sample(url: str, phase: Phase, deadline: float, every: float,
                  kept: aiohttp.ClientSession | None, limits: aiohttp.ClientTimeout) -> None:
    i = 0
    while time.monotonic() < deadline:
        route = CONTROL[i % len(CONTROL)]
        i += 1
        started = time.perf_counter()
        try:
            if kept is not None:
                async with kept.get(url + route, headers={"x-llmman-hop": "1"}) as r:
                    await r.read()
                    phase.errors += r.status != 200
            else:
                async with aiohttp.ClientSession(timeout=limits) as session, \
                        session.get(url + route, headers={"x-llmman-hop": "1"}) as r:
                    await r.read()
                    phase.errors += r.status != 200
        except TimeoutError:
            pass
        phase.routes[route].samples.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(every)


def run_phase(url: str, name: str, route: str | None, streams: int, seconds: float, every: float,
              keepalive: bool = False) -> Phase:
    phase = Phase(name, {r: RouteTimes(r) for r in CONTROL})
    tokens, errors = multiprocessing.Value("q", 0), multiprocessing.Value("q", 0)
    worker = None
    if route is not None:
        worker = multiprocessing.Process(target=load, args=(url, route, streams, tokens, errors))
    if worker is not None:
        worker.start()
        deadline = time.monotonic() + 60
        while tokens.value < streams and time.monotonic() < deadline:  # the streams are flowing
            time.sleep(0.1)
    started, before = time.monotonic(), tokens.value
    asyncio.run(sample(url, phase, seconds, every, keepalive))
    phase.seconds = time.monotonic() - started
    phase.tokens = tokens.value - before
    if worker is not None:
        worker.terminate()
        worker.join()
    phase.errors += errors.value
    return phase


def print_table(phases: list[Phase]) -> None:
    print(f"load average {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    print(f"{'phase':8} {'route':14} {'n':>4} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}  streams tokens/s")
    for phase in phases:
        rate = phase.tokens / phase.seconds if phase.seconds else 0.0
        for i, (route, times) in enumerate(phase.routes.items()):
            s = times.summary()
            tail = f"  {rate:,.0f}" if i == 0 and phase.tokens else ""
            figures = f"{s['n']:>4.0f} {s['p50']:>8.1f} {s['p95']:>8.1f} {s['max']:>8.1f}"
            print(f"{phase.name:8} {route:14} {figures}{tail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--samples-every", type=float, default=0.05)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keepalive", action="store_true", help="ask the control routes on one connection")
    parser.add_argument("--phases", default="idle,openai,ollama")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmman-bench-control-") as tmp_s:
        tmp = Path(tmp_s)
        make_store(tmp, ("tiny",))
        (tmp / "bin").mkdir()
        daemon = start_daemon(tmp, extra_env={
            "LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_MEMORY": "4GB",
            "LLMMAN_NUM_PARALLEL": str(args.streams), "FAKE_REPLY": REPLY, "LLMMAN_LOG_REQUESTS": "0"})
        try:
            phases = []
            routes = {"idle": None, "openai": "/v1/chat/completions", "ollama": "/api/chat"}
            for name in args.phases.split(","):
                phases.append(run_phase(daemon.url, name, routes[name], args.streams, args.seconds,
                                        args.samples_every, args.keepalive))
        finally:
            daemon.stop()
    print_table(phases)
    if args.json:
        rows = [{**asdict(p), "routes": {r: t.summary() for r, t in p.routes.items()}} for p in phases]
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if any(p.errors for p in phases) else 0


if __name__ == "__main__":
    raise SystemExit(main())
