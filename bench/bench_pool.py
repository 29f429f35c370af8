"""Benchmark: does a pool of llmman nodes serve as one bigger server? (issue 11's proof)

Usage: ``.venv/bin/python bench/bench_pool.py [--quick] [--rounds N] [--seconds S] [--json OUT]``
(``make bench-pool``). No model and no llama-server are needed: every node's llama-server is the fake
one (tests/fakes/fake_llama_server.py) with a fixed capacity, so what is measured is where llmman sends
the work, not how fast two shared cores decode.

Three parts, each with its own private ``llmman serve`` daemons on loopback addresses (own HOME, store
and port, ``tests/integration/daemons.py``):

1. **Throughput.** 1, 2 and 3 nodes (127.0.0.2, .3, .4), every one storing the same tiny synthetic model
   (``tests/unit/ggufgen.py``) and naming all the others as peers; each node's llama-server is the fake
   with ``LLMMAN_NUM_PARALLEL=4`` slots, held to them (``FAKE_SLOTS=1``: a fifth stream waits for a slot,
   as with llama-server) at 20 tokens/s per stream (``FAKE_TOKEN_DELAY=0.05``), so one node serves at
   most 80 tokens/s. A round: ``STREAMS`` (24) workers each send OpenAI streams to node 1 back to back
   (each with its own prompt, ``max_tokens`` ``--tokens``: 20 tokens, one second of a slot) for
   ``--seconds``; the streams still running then are read to their end. Tokens/s is the content chunks
   (one per token) that arrived from ``RAMP_S`` to ``--seconds`` into the round over that window: the
   rate while 24 clients keep the pool busy, not blurred by the drain of the queues at the end (which
   would count one node's 20 queued streams against it). TTFT is from sending a stream to its first
   content chunk, over every stream. Every pool runs a warm-up round (printed and kept in the JSON, left
   out of the figures: it loads the model and, under the default policy, lets replicas appear) and then
   ``--rounds`` measured rounds. The pools with 2 and 3 nodes run with ``LLMMAN_SPREAD=off`` and with the
   default policy (nothing set), in the same run; the 1-node baseline has no peers, so no policy applies
   to it. Reported: tokens/s, its ratio to the baseline (median over rounds), TTFT p50/p95, the median
   decode time of a stream (first token to end: 1 s when the CPUs keep up with the fakes), which node's
   fakes served how many streams (their ``/fake/stats`` ``started`` counters), and every node's
   ``/llmman/node`` in-flight and queued counts half-way through the round.
2. **Cold placement.** Eight live peers (real daemons on 127.0.0.3-.10, each storing the model, none
   loaded) and a front node built in this process exactly as the daemon builds it (settings, peers,
   scheduler, store, gateway, ``Services``), storing nothing. Timed: ``Router.decide`` for the model
   (loaded nowhere) with the first 1, 3 and 8 of those peers, ``--decisions`` times after 20 warm-up
   ones: median and p95, plus the very first decision (new connections); once with
   ``aggregation.refresh`` 0 (every decision makes its probe round) and once with the background state
   of a running daemon (``Peers.start``). Target under 20 ms.
3. **A silent peer.** Nodes A and B store the model; B has it loaded (and A's ``/llmman/pool`` shows
   it); a request through A is forwarded to B (so A has seen B up with the model); then B's daemon is
   stopped with SIGSTOP and one more stream is sent to A, which has to give up on B and serve it itself
   (a cold load on A). Its TTFT minus that of a cold load on A alone (the same request with
   ``x-llmman-hop``, measured first on the same A) is the cost of the silent peer, under the default
   ``aggregation.stall_timeout``. ``--silent-reps`` fresh pairs; a stream that takes longer than
   ``--silent-cap`` seconds is given up and reported as such.

Timings are reported, never asserted; the exit status is non-zero only when a request or the set-up
failed. Results go to ``bench/results-pool-<date>.json`` (``-quick`` in the name for ``--quick``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_proxy import REPO, BenchError, Target, one_stream
from tests.fakes.fake_llama_server import make_launcher
from tests.fakes.inprocess import make_store
from tests.integration.daemons import HOP, Daemon, free_port, local_ps, start_daemon

from llmman.api.services import Services
from llmman.cluster.peers import RETRY_S
from llmman.cluster.router import Intent, Origin
from llmman.config.settings import load_settings
from llmman.daemon import make_launcher as daemon_launcher
from llmman.daemon import make_peers
from llmman.gateway import Gateway
from llmman.sched.scheduler import Scheduler
from llmman.store import Store

MODEL = "tiny"
SLOTS = 4
TOKEN_DELAY_S = 0.05  # 20 tokens/s per stream
STREAMS = 24
NODE_COUNTS = (1, 2, 3)
PEER_COUNTS = (1, 3, 8)
REPLY = " ".join(f"w{i}" for i in range(100))  # 100 tokens; max_tokens cuts each stream shorter
TARGETS = {2: 1.8, 3: 2.7}  # default policy, ratio to one node (issue 11)
TARGET_PLACEMENT_MS = 20.0
RAMP_S = 0.5  # the start of a round, left out of its tokens/s (the first requests being placed)


def host(i: int) -> str:
    """The loopback address of node ``i`` (0-based): 127.0.0.2, .3, ..."""
    return f"127.0.0.{2 + i}"


def fake_env(root: Path, reply: str = REPLY, delay: float = TOKEN_DELAY_S) -> dict[str, str]:
    """Environment of a daemon whose llama-server is the fake with fixed capacity."""
    bindir = root / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    return {"LLMMAN_LLAMA_SERVER": str(make_launcher(bindir)), "LLMMAN_NUM_PARALLEL": str(SLOTS),
            "FAKE_REPLY": reply, "FAKE_TOKEN_DELAY": str(delay), "FAKE_SLOTS": "1"}


@contextmanager
def pool(tmp: Path, count: int, env: dict[str, str], *, reply: str = REPLY,
         delay: float = TOKEN_DELAY_S, mutual: bool = True) -> Iterator[list[Daemon]]:
    """``count`` daemons, each storing MODEL; with ``mutual`` every one names all the others as peers.
    Stopped with SIGTERM on exit (a stopped process is continued first)."""
    ports = [free_port(host(i)) for i in range(count)]
    urls = [f"http://{host(i)}:{p}" for i, p in enumerate(ports)]
    daemons: list[Daemon] = []
    try:
        for i in range(count):
            root = tmp / f"node{i + 1}"
            root.mkdir(parents=True)
            make_store(root, (MODEL,))
            extra = {**fake_env(root, reply, delay), **env}
            if mutual:
                extra["LLMMAN_PEERS"] = ",".join(u for j, u in enumerate(urls) if j != i)
            daemons.append(start_daemon(root, host=host(i), port=ports[i], extra_env=extra))
        if mutual:
            wait_pool_up(daemons)
        yield daemons
    finally:
        for d in daemons:
            if d.process.poll() is None:
                os.kill(d.process.pid, signal.SIGCONT)
                d.stop(signal.SIGTERM)


def wait_pool_up(daemons: Sequence[Daemon], timeout: float = 30.0) -> None:
    """Wait until every daemon's ``GET /llmman/pool`` shows each of its peers up and seen (those that
    started after it were at first refused). A daemon without that route: one re-probe interval.

    Raises:
        BenchError: a peer was still not up after ``timeout`` seconds.
    """
    def all_up(d: Daemon) -> bool:
        answer = httpx.get(d.url + "/llmman/pool", timeout=10)
        if answer.status_code == 404:
            time.sleep(RETRY_S + 0.5)  # an older daemon: no view of its peers to wait on
            return True
        peers = [n for n in answer.json()["nodes"] if not n["self"]]
        return all(n["state"] == "up" and n["last_seen"] is not None for n in peers)

    for d in daemons:
        wait_for(functools.partial(all_up, d), f"{d.url} to see its peers up", timeout)


def chat_body(prompt: str, tokens: int) -> bytes:
    """An OpenAI streaming chat body for MODEL that reports usage."""
    return orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                         "max_tokens": tokens, "stream": True, "stream_options": {"include_usage": True}})


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..1); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


# ------------------------------------------------------------------------------------------ throughput
def node_of(d: Daemon) -> str:
    """How a node is named in the figures: its loopback address."""
    return d.url.split("//")[1].rsplit(":", 1)[0]


def fake_counts(daemons: Sequence[Daemon]) -> dict[str, dict[int, int]]:
    """Per node (``host``), per fake child pid: generations it has begun (``/fake/stats`` ``started``)."""
    out: dict[str, dict[int, int]] = {}
    for d in daemons:
        node = out.setdefault(node_of(d), {})
        for child in d.children():
            try:
                argv = child.cmdline()
                url = f"http://{argv[argv.index('--host') + 1]}:{argv[argv.index('--port') + 1]}"
                node[child.pid] = int(httpx.get(url + "/fake/stats", timeout=10).json()["started"])
            except (ValueError, IndexError, httpx.HTTPError, OSError):
                continue  # a child that is starting or going: counted at the next look
    return out


def served_between(before: dict[str, dict[int, int]], after: dict[str, dict[int, int]]) -> dict[str, int]:
    """Streams each node's fakes began between two :func:`fake_counts` looks."""
    return {node: sum(n - before.get(node, {}).get(pid, 0) for pid, n in pids.items())
            for node, pids in after.items()}


@dataclass(frozen=True)
class Load:
    """What a round sends: STREAMS workers each streaming ``tokens``-token answers back to back for
    ``seconds``; the tokens that arrive between RAMP_S and ``seconds`` make its tokens/s."""

    tokens: int
    seconds: float

    @property
    def window(self) -> float:
        """Seconds of the round over which tokens are counted."""
        return self.seconds - RAMP_S


@dataclass
class PoolRound:
    """One round: tokens/s in its window, every stream's TTFT and decode time, and who served them."""

    window_tokens: int  # content chunks (one per token from the fake) that arrived in the window
    window: float
    tokens: int  # every token of the round, the drain after the window included
    wall: float
    ttft_ms: list[float]
    decode_ms: list[float]  # per stream: from its first content chunk to its end
    errors: int
    served: dict[str, int]
    copies: dict[str, int]  # node -> llama-server children (loaded copies) at the round's end
    busy: dict[str, dict[str, int]]  # node -> its /llmman/node in_flight and queued mid-window

    @property
    def tps(self) -> float:
        """Tokens per second in the window (all workers busy sending)."""
        return self.window_tokens / self.window if self.window > 0 else 0.0

    def line(self) -> str:
        """A one-line account of the round."""
        served = ", ".join(f"{n} {c}" + (f" ({self.copies[n]} copies)" if self.copies.get(n, 1) > 1 else "")
                           for n, c in self.served.items())
        busy = ", ".join(f"{n} {b['in_flight']}+{b['queued']}q" for n, b in self.busy.items())
        return (f"{self.tps:7.1f} tok/s  TTFT p50 {percentile(self.ttft_ms, 0.5):7.1f} ms "
                f"p95 {percentile(self.ttft_ms, 0.95):7.1f} ms  served: {served}  "
                f"in flight+queued mid-round: {busy}"
                f"{f'  errors {self.errors}' if self.errors else ''}")


@dataclass
class Cell:
    """One pool (policy, node count): its warm-up round and measured rounds."""

    policy: str
    nodes: int
    warmup: PoolRound | None = None
    rounds: list[PoolRound] = field(default_factory=list)

    @property
    def tps(self) -> float:
        """Median tokens/s over the measured rounds."""
        return statistics.median(r.tps for r in self.rounds)

    @property
    def round_tps(self) -> float:
        """Median over the measured rounds of all their tokens over their wall time (the drain included)."""
        return statistics.median(r.tokens / r.wall for r in self.rounds)

    def summary(self, baseline: Cell) -> dict[str, Any]:
        """The figures of the table, and every round, for the JSON; ratios to ``baseline``'s."""
        ttfts = [t for r in self.rounds for t in r.ttft_ms]
        ratios = [r.tps / baseline.tps for r in self.rounds] if baseline.tps > 0 else []
        base = baseline.round_tps
        whole = [r.tokens / r.wall / base for r in self.rounds] if base > 0 else []
        return {
            "policy": self.policy, "nodes": self.nodes, "rounds": len(self.rounds), "tps": self.tps,
            "ratio": statistics.median(ratios) if ratios else 0.0,
            "round_tps": self.round_tps, "round_ratio": statistics.median(whole) if whole else 0.0,
            "ratio_min": min(ratios, default=0.0), "ratio_max": max(ratios, default=0.0),
            "ttft_p50_ms": percentile(ttfts, 0.5), "ttft_p95_ms": percentile(ttfts, 0.95),
            "decode_p50_ms": percentile([d for r in self.rounds for d in r.decode_ms], 0.5),
            "errors": sum(r.errors for r in self.rounds),
            "per_round": [round_doc(r) for r in self.rounds],
            "warmup": None if self.warmup is None else round_doc(self.warmup),
        }


def round_doc(r: PoolRound) -> dict[str, Any]:
    """One round for the JSON."""
    return {"tps": r.tps, "window_tokens": r.window_tokens, "window_s": r.window, "tokens": r.tokens,
            "wall_s": r.wall, "streams": len(r.ttft_ms), "ttft_p50_ms": percentile(r.ttft_ms, 0.5),
            "ttft_p95_ms": percentile(r.ttft_ms, 0.95), "decode_p50_ms": percentile(r.decode_ms, 0.5),
            "errors": r.errors, "served": r.served, "copies": r.copies, "busy_mid_round": r.busy}


async def busy_after(session: aiohttp.ClientSession, daemons: Sequence[Daemon],
                     delay: float) -> dict[str, dict[str, int]]:
    """Each node's ``/llmman/node`` ``in_flight`` and ``queued`` ``delay`` seconds into a round (where
    the work is); a node that does not answer is left out."""
    await asyncio.sleep(delay)  # a sampling point of the measurement, not a synchronisation

    async def one(d: Daemon) -> tuple[str, dict[str, int]] | None:
        try:
            async with session.get(d.url + "/llmman/node", headers=HOP) as resp:
                doc = await resp.json()
            return node_of(d), {"in_flight": doc["in_flight"], "queued": doc["queued"]}
        except (aiohttp.ClientError, ValueError, KeyError, TypeError):
            return None

    found = await asyncio.gather(*(one(d) for d in daemons))
    return dict(f for f in found if f is not None)


@dataclass(frozen=True)
class Streamed:
    """One stream: seconds to its first content chunk, from there to its end, and its content chunks."""

    ttft: float
    decode: float
    tokens: int


async def timed_stream(session: aiohttp.ClientSession, url: str, body: bytes,
                       stamps: list[float]) -> Streamed:
    """POST one OpenAI stream and read it to its end, appending the arrival time of every content chunk
    to ``stamps``.

    Raises:
        BenchError: a non-200 status, an error in the stream, or a stream with no content.
    """
    start = time.perf_counter()
    first: float | None = None
    count = 0
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            raise BenchError(f"HTTP {resp.status}: {(await resp.read())[:300]!r}")
        async for line in resp.content:
            payload = line[5:].strip() if line.startswith(b"data:") else b""
            if not payload or payload == b"[DONE]":
                continue
            chunk = orjson.loads(payload)
            if "error" in chunk:
                raise BenchError(f"error in stream: {payload[:300]!r}")
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                now = time.perf_counter()
                stamps.append(now)
                count += 1
                first = now if first is None else first
    if first is None:
        raise BenchError("the stream carried no content")
    return Streamed(first - start, time.perf_counter() - first, count)


async def pool_round(session: aiohttp.ClientSession, daemons: Sequence[Daemon], tag: str,
                     load: Load) -> PoolRound:
    """STREAMS workers streaming to node 1 back to back, each stream with its own prompt, until
    ``load.seconds`` have passed (the streams then running are read to their end); the fakes' counters
    are read around the round and every node's load mid-round."""
    url = daemons[0].url + "/v1/chat/completions"
    stamps: list[float] = []

    async def worker(w: int) -> list[Streamed | BaseException]:
        out: list[Streamed | BaseException] = []
        k = 0
        while time.perf_counter() < deadline:
            body = chat_body(f"Stream {w}.{k} of round {tag}: tell me a story.", load.tokens)
            k += 1
            try:
                out.append(await timed_stream(session, url, body, stamps))
            except (BenchError, aiohttp.ClientError, TimeoutError) as exc:  # counted; the exit status is 1
                out.append(exc)
        return out

    before = await asyncio.to_thread(fake_counts, daemons)
    start = time.perf_counter()
    deadline = start + load.seconds
    sampler = asyncio.create_task(busy_after(session, daemons, load.seconds / 2))
    results = [r for rs in await asyncio.gather(*(worker(w) for w in range(STREAMS))) for r in rs]
    wall = time.perf_counter() - start
    busy = await sampler
    after = await asyncio.to_thread(fake_counts, daemons)
    good = [r for r in results if isinstance(r, Streamed)]
    bad = [r for r in results if not isinstance(r, Streamed)]
    for message in sorted({f"{type(e).__name__}: {e}" for e in bad}):
        print(f"  ERROR ({sum(f'{type(e).__name__}: {e}' == message for e in bad)}x): {message}",
              file=sys.stderr, flush=True)
    in_window = sum(1 for t in stamps if start + RAMP_S <= t < deadline)
    return PoolRound(window_tokens=in_window, window=load.window, tokens=len(stamps), wall=wall,
                     ttft_ms=[r.ttft * 1000 for r in good], decode_ms=[r.decode * 1000 for r in good],
                     errors=len(bad), served=served_between(before, after),
                     copies={node: len(pids) for node, pids in after.items()}, busy=busy)


async def run_cell(daemons: Sequence[Daemon], cell: Cell, rounds: int, load: Load) -> None:
    """A warm-up round, then ``rounds`` measured rounds, each printed as it ends."""
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        for i in range(rounds + 1):
            got = await pool_round(session, daemons, f"{cell.policy}-{cell.nodes}-{i}", load)
            print(f"  {cell.policy:<8} {cell.nodes} node(s) {'warm-up' if i == 0 else f'round {i}':>8}: "
                  f"{got.line()}", flush=True)
            if i == 0:
                cell.warmup = got
            else:
                cell.rounds.append(got)


def throughput(tmp: Path, policies: Sequence[str], rounds: int, load: Load) -> list[Cell]:
    """The 1-node baseline, then 2 and 3 nodes under each of ``policies`` (``off``: LLMMAN_SPREAD=off;
    any other: the default, nothing set)."""
    plan: list[tuple[str, int, dict[str, str]]] = [("none", 1, {})]
    plan += [(p, n, {"LLMMAN_SPREAD": "off"} if p == "off" else {})
             for p in policies for n in NODE_COUNTS[1:]]
    cells = []
    for k, (policy, nodes, env) in enumerate(plan):
        cell = Cell(policy, nodes)
        with pool(tmp / f"pool{k}", nodes, env) as daemons:
            asyncio.run(run_cell(daemons, cell, rounds, load))
        cells.append(cell)
    return cells


def print_throughput(cells: Sequence[Cell], default_policy: str, load: Load) -> list[dict[str, Any]]:
    """The throughput table; returns the summaries."""
    rows = [c.summary(cells[0]) for c in cells]
    head = (f"{'policy':<10}{'nodes':>6}{'tok/s':>9}{'ratio':>8}{'min-max':>13}{'whole':>7}"
            f"{'TTFT p50 ms':>13}{'TTFT p95 ms':>13}{'decode ms':>11}{'errors':>8}"
            "  streams served per node (last round)")
    print(head)
    print("-" * len(head))
    for s in rows:
        served = s["per_round"][-1]["served"] if s["per_round"] else {}
        where = " ".join(f"{n}:{c}" for n, c in served.items())
        print(f"{s['policy']:<10}{s['nodes']:>6}{s['tps']:>9.1f}{s['ratio']:>8.2f}"
              f"{s['ratio_min']:>6.2f}-{s['ratio_max']:<6.2f}{s['round_ratio']:>7.2f}"
              f"{s['ttft_p50_ms']:>13.1f}{s['ttft_p95_ms']:>13.1f}"
              f"{s['decode_p50_ms']:>11.0f}{s['errors']:>8}  {where}")
    print(f"targets ({default_policy}, the default): ratio >= {TARGETS[2]} with 2 nodes, >= {TARGETS[3]} "
          f"with 3; off: 1x. One node: {SLOTS} slots x {1 / TOKEN_DELAY_S:.0f} tok/s = "
          f"{SLOTS / TOKEN_DELAY_S:.0f} tok/s at most. decode ms: median time from a stream's first token "
          f"to its end ({load.tokens * TOKEN_DELAY_S * 1000:.0f} ms when the CPUs keep up with the fakes); "
          f"tok/s: tokens arriving from {RAMP_S:g} s to {load.seconds:g} s into a round; whole: the ratio of "
          f"whole rounds (all their tokens over their wall time, the drain of the queues included).")
    return rows


# ----------------------------------------------------------------------------------- cold placement
async def time_decisions(root: Path, peer_urls: Sequence[str], decisions: int, *,
                         background: bool) -> dict[str, Any]:
    """``Router.decide`` for MODEL (loaded nowhere) on a front node built as the daemon builds it, whose
    peers are ``peer_urls``; milliseconds. ``background``: the peers' state refreshed in the background
    as a running daemon does (``aggregation.refresh`` default, ``Peers.start``); else refresh 0, so
    every decision makes its probe round, as a cold request without fresh state does."""
    env = {"HOME": str(root / "home"), "LLMMAN_MODELS": str(root / "store"), "LLMMAN_HOST": "127.0.0.2:1",
           "LLMMAN_PEERS": ",".join(peer_urls), "LLMMAN_OFFLINE": "1", "PATH": os.environ.get("PATH", "")}
    if not background:
        env["LLMMAN_PEER_REFRESH"] = "0"
    settings = load_settings(env=env, system_file=root / "no-system.conf", user_file=root / "no-user.conf")
    store = Store(settings.models)
    peers = make_peers(settings)
    scheduler = Scheduler(daemon_launcher(settings, "/bin/false", env),
                          default_keep_alive=settings.keep_alive, capacity=8 * 10**9)
    session = aiohttp.ClientSession(auto_decompress=False)
    try:
        gateway = Gateway(store, scheduler, session, context_length=settings.context_length,
                          aliases=settings.aliases)
        router = Services(settings=settings, store=store, scheduler=scheduler, gateway=gateway,
                          peers=peers).router
        if background:
            peers.start()
        times: list[float] = []
        kinds: dict[str, int] = {}
        for _ in range(decisions + 20):
            t0 = time.perf_counter()
            decision = await router.decide(MODEL, Intent.INFER, Origin())
            times.append((time.perf_counter() - t0) * 1000)
            kinds[type(decision).__name__] = kinds.get(type(decision).__name__, 0) + 1
    finally:
        await scheduler.close()
        await session.close()
        await peers.close()
        await peers.session.close()
    timed = times[20:]
    return {"peers": len(peer_urls), "state": "background" if background else "probe round",
            "first_ms": times[0], "median_ms": statistics.median(timed), "p95_ms": percentile(timed, 0.95),
            "decisions": kinds}


def placement(tmp: Path, decisions: int) -> list[dict[str, Any]]:
    """Eight live peers; the decision time with the first 1, 3 and 8 of them, with a probe round per
    decision and with background state."""
    ports = [free_port(host(1 + i)) for i in range(max(PEER_COUNTS))]
    daemons: list[Daemon] = []
    out = []
    try:
        for i, port in enumerate(ports):
            root = tmp / f"peer{i + 1}"
            root.mkdir(parents=True)
            make_store(root, (MODEL,))
            daemons.append(start_daemon(root, host=host(1 + i), port=port, extra_env=fake_env(root)))
        for background in (False, True):
            for count in PEER_COUNTS:
                front = tmp / f"front{count}-{background}"
                front.mkdir()
                urls = [d.url for d in daemons[:count]]
                out.append(asyncio.run(time_decisions(front, urls, decisions, background=background)))
    finally:
        for d in daemons:
            d.stop(signal.SIGTERM)
    print(f"{'state':<13}{'live peers':>10}{'first ms':>10}{'median ms':>11}{'p95 ms':>9}  decisions")
    for row in out:
        print(f"{row['state']:<13}{row['peers']:>10}{row['first_ms']:>10.2f}{row['median_ms']:>11.3f}"
              f"{row['p95_ms']:>9.3f}  {row['decisions']}")
    print(f"target: under {TARGET_PLACEMENT_MS:.0f} ms on loopback ('first': opening the connections too)")
    return out


# -------------------------------------------------------------------------------------- silent peer
async def first_token(url: str, body: bytes, headers: dict[str, str], cap: float) -> float | None:
    """Seconds from sending ``body`` to the first content chunk (the stream is read to its end, by
    bench_proxy's ``one_stream``); None when the stream did not end within ``cap`` seconds.

    Raises:
        BenchError: a non-200 answer, an error in the stream, or no content.
    """
    timeout = aiohttp.ClientTimeout(total=cap)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        try:
            return (await one_stream(session, Target("silent", url, body, "sse"))).ttft
        except TimeoutError:
            return None


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition()`` until true.

    Raises:
        BenchError: it did not hold within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling a subprocess's state; the condition is the event


def sees_loaded(front: Daemon, peer: str) -> bool:
    """Whether ``front``'s ``/llmman/pool`` shows MODEL loaded on the peer at address ``peer`` (a daemon
    without that route: true, its probe per request sees it)."""
    answer = httpx.get(front.url + "/llmman/pool", timeout=10)
    if answer.status_code == 404:
        return True
    return any(n["address"].rsplit(":", 1)[0] == peer and any(MODEL in ref for ref in n["models"])
               for n in answer.json()["nodes"] if not n["self"])


def silent_once(tmp: Path, cap: float) -> dict[str, Any]:
    """One fresh pair A, B: A's cold local load, then the stream that has to give up on a stopped B."""
    body = chat_body("Hello there", 4)
    with pool(tmp, 2, {}, reply="a b c d", delay=0.0) as (a, b):
        chat = "/v1/chat/completions"
        alone = asyncio.run(first_token(a.url + chat, body, HOP, cap))  # served on A: a cold load there
        if alone is None:
            raise BenchError("the cold load on A alone gave no token")
        httpx.post(a.url + "/api/generate", json={"model": MODEL, "keep_alive": 0}, headers=HOP,
                   timeout=30).raise_for_status()
        wait_for(lambda: not local_ps(a) and not a.children(), "A to unload the model")
        if asyncio.run(first_token(b.url + chat, body, HOP, cap)) is None:  # B loads it
            raise BenchError("the load on B gave no token")
        wait_for(functools.partial(sees_loaded, a, node_of(b)), "A to see the model loaded on B")
        if asyncio.run(first_token(a.url + chat, body, {}, cap)) is None or a.children():
            raise BenchError("a request through A was not forwarded to B (B has the model loaded)")
        os.kill(b.process.pid, signal.SIGSTOP)
        given_up = asyncio.run(first_token(a.url + chat, body, {}, cap))
        served_by_a = bool(a.children())
    out: dict[str, Any] = {"alone_ms": alone * 1000, "served_by_a": served_by_a,
                           "silent_ms": None if given_up is None else given_up * 1000}
    out["added_ms"] = None if given_up is None else (given_up - alone) * 1000
    return out


def silent_peer(tmp: Path, reps: int, cap: float) -> dict[str, Any]:
    """``reps`` fresh pairs (stopping early once one exceeds ``cap``); medians."""
    stall = load_settings(env={}, system_file=tmp / "none", user_file=tmp / "none").stall_timeout
    runs = []
    for i in range(reps):
        run = silent_once(tmp / f"silent{i}", cap)
        runs.append(run)
        shown = "over the cap" if run["silent_ms"] is None else f"{run['silent_ms']:.0f} ms"
        print(f"  silent peer, pair {i + 1}: A alone {run['alone_ms']:.0f} ms, giving up on B {shown}"
              f"{'' if run['served_by_a'] else ' (A did not serve it)'}", flush=True)
        if run["silent_ms"] is None:
            break
    added = [r["added_ms"] for r in runs if r["added_ms"] is not None]
    out = {"stall_timeout_s": stall, "cap_s": cap, "runs": runs,
           "added_ms": statistics.median(added) if len(added) == len(runs) else None}
    shown = f"{out['added_ms']:.0f} ms" if out["added_ms"] is not None else f"over {cap:.0f} s"
    print(f"cost of one silent peer (added TTFT, median of {len(runs)}; stall_timeout {stall:g} s): {shown}")
    return out


def commit() -> str:
    """The checkout's commit, ``+`` when the working tree has changes (empty when git is missing)."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+" if dirty else "")


def main() -> int:
    """Run the three parts, print their tables, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="rounds of 5 s, one measured; fewer decisions")
    parser.add_argument("--rounds", type=int, help="measured rounds per pool (default 2; --quick 1)")
    parser.add_argument("--tokens", type=int, default=20, help="tokens per stream (default 20: 1 s each)")
    parser.add_argument("--seconds", type=float, help="seconds of sending per round (10; --quick 5)")
    parser.add_argument("--decisions", type=int, help="placement decisions timed per peer count (200; 50)")
    parser.add_argument("--silent-reps", type=int, help="fresh pairs for the silent peer (2; 1)")
    parser.add_argument("--silent-cap", type=float, default=30.0, help="seconds before a stream is given up")
    parser.add_argument("--json", type=Path, help="where to write the results")
    parser.add_argument("--only", choices=("throughput", "placement", "silent"), help="run one part only")
    parser.add_argument("--policies", default="off,default", help="the pools' policies: off, default or both")
    parser.add_argument("--workdir", type=Path, help="keep the daemons' homes, stores and logs here")
    args = parser.parse_args()
    quick = args.quick
    rounds = args.rounds or (1 if quick else 2)
    load = Load(args.tokens, args.seconds or (5.0 if quick else 10.0))
    decisions = args.decisions or (50 if quick else 200)
    reps = args.silent_reps or (1 if quick else 2)
    today = datetime.date.today().isoformat()
    out_path = args.json or REPO / "bench" / f"results-pool-{today}{'-quick' if quick else ''}.json"
    doc: dict[str, Any] = {"date": today, "commit": commit(), "streams": STREAMS, "slots": SLOTS,
                           "tokens_per_s_per_stream": 1 / TOKEN_DELAY_S, "tokens": load.tokens,
                           "seconds": load.seconds, "ramp_s": RAMP_S, "rounds": rounds,
                           "load_average_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="llmman-bench-pool-") as name:
        tmp = args.workdir or Path(name)
        default_policy = load_settings(env={}, system_file=tmp / "none", user_file=tmp / "none").spread
        doc["default_policy"] = default_policy
        errors = 0
        try:
            if args.only in (None, "throughput"):
                print(f"throughput: {STREAMS} workers streaming {load.tokens}-token answers from node 1 "
                      f"back to back for {load.seconds:g} s; a warm-up and {rounds} round(s) per pool")
                policies = [default_policy if p == "default" else p for p in args.policies.split(",")]
                cells = throughput(tmp / "throughput", policies, rounds, load)
                doc["throughput"] = print_throughput(cells, default_policy, load)
                errors += sum(r["errors"] for r in doc["throughput"])
            if args.only in (None, "placement"):
                print(f"cold placement: Router.decide, {decisions} decisions per peer count")
                doc["placement"] = placement(tmp / "placement", decisions)
            if args.only in (None, "silent"):
                print("silent peer (SIGSTOP after it was seen up):")
                doc["silent_peer"] = silent_peer(tmp / "silent", reps, args.silent_cap)
        except (BenchError, RuntimeError) as exc:  # what was measured before is still written
            print(f"bench failed: {exc}", file=sys.stderr)
            doc["failed"] = str(exc)
            errors += 1
    doc["load_average_after"] = os.getloadavg()
    out_path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"results: {out_path}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
