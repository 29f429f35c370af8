"""Benchmark: what one aggregation hop adds to streaming chat.

Usage: ``.venv/bin/python bench/bench_hop.py [--rounds N] [--requests K] [--json OUT]``. It starts two private
``llmman serve`` daemons: ``b`` on 127.0.0.3 with SmolLM2-135M stored (``LLMMAN_TEST_MODEL`` or
``~/.cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf``) and loaded, and ``a`` on 127.0.0.2, which stores
nothing and names ``b`` as its peer. Both use ``LLMMAN_NUM_PARALLEL=8`` and ``LLMMAN_CONTEXT_LENGTH=512``.

Compared, at 1 and 8 concurrent streams: Ollama ``/api/chat`` streamed through ``a`` (placement probe of
``b``, then a forward with ``x-llmman-hop``) against the very same request sent to ``b`` directly. Bodies:
``options.num_predict`` 64, temperature 0. Rounds, warm-up, medians and the ratio are computed as in
bench_proxy.py (whose request loop this reuses): tokens/s is a round's tokens over its wall time; TTFT the
time from sending to the first non-empty content; "added TTFT" the median per-round difference.
Timings are reported, never asserted; the exit status is non-zero only if a request or the set-up failed.

Then the hop's own cost, isolated: a second pair of daemons whose llama-server is the fake one answering
at once (tests/fakes), and ``--pairs`` times the same stream to ``b`` and through ``a`` back to back,
reporting the median of the differences in time to the first line (on a small shared machine the real
llama-server's variance and other load hide a few milliseconds in the round figures).

Then the placement decision on its own, with 1, 3 and 8 peers: fake peers (a process each, serving
``GET /llmman/node`` on a loopback port and answering one loaded and five stored models) are probed
through :class:`llmman.cluster.peers.Peers` on a keep-alive session like the daemon's, and the nodes
ranked; reported are the median and 95th percentile of probe + rank over ``--decisions`` decisions
(after 20 warm-up ones), and the rank alone. ``--placement-only`` skips the streaming part (no model
needed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_proxy import (
    DEFAULT_MODEL_FILE,
    MODEL,
    BenchError,
    Comparison,
    Target,
    ollama_body,
    run_round,
)
from tests.integration.daemons import Daemon, start_daemon

from llmman.cluster.peers import Peers
from llmman.cluster.placement import LOCAL, NodeView, model_size, rank
from llmman.config.table import HostAddress
from llmman.refs import parse_reference
from llmman.store import Store

CONCURRENCY = (1, 8)
PEER_COUNTS = (1, 3, 8)
REF = f"docker.io/ai/{MODEL}"
NODE_DOC = {"memory": 128 * 10**9, "free": 127 * 10**9, "loaded": {"docker.io/ai/other:1": 10**9},
            "stored": {f"docker.io/ai/m{i}:1": 10**9 for i in range(4)} | {REF: 98362432},
            "in_flight": 0, "queued": 0, "max_queue": 512}
ENV = {"LLMMAN_NUM_PARALLEL": "8", "LLMMAN_CONTEXT_LENGTH": "512", "LLMMAN_KEEP_ALIVE": "-1"}


async def run_all(hop_url: str, local_url: str, rounds: int, requests: int) -> list[Comparison]:
    """Each concurrency: a warm-up round, then ``rounds`` rounds of local and hop (alternating order)."""
    body = ollama_body()
    local = Target("direct", f"{local_url}/api/chat", body, "ndjson")
    hop = Target("llmman", f"{hop_url}/api/chat", body, "ndjson")
    timeout = aiohttp.ClientTimeout(total=600)
    out: list[Comparison] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64), timeout=timeout) as session:
        for conc in CONCURRENCY:
            result = Comparison(route="hop", conc=conc)
            for i in range(rounds + 1):
                order = [local, hop] if i % 2 == 0 else [hop, local]
                got = {t.name: await run_round(session, t, conc, requests) for t in order}
                if i == 0:
                    result.warmup_errors = sum(r.errors for r in got.values())
                    continue
                d, m = got["direct"], got["llmman"]
                result.direct.append(d)
                result.llmman.append(m)
                print(f"  conc {conc} round {i}: local {d.tps:7.1f} tok/s {d.ttft_ms:6.1f} ms | "
                      f"hop {m.tps:7.1f} tok/s {m.ttft_ms:6.1f} ms | ratio {m.tps / d.tps:.3f}", flush=True)
            out.append(result)
    return out


def paired_first_line(hop_url: str, local_url: str, pairs: int, model: str) -> dict[str, float]:
    """Added time to first byte per hop, measured in pairs: ``pairs`` times, the same streamed
    ``/api/chat`` to ``b`` directly and through ``a`` back to back (order alternating), timing the first
    NDJSON line of each; medians in ms. Pairing cancels most of the load other processes put on the
    machine."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": True,
            "options": {"num_predict": 1, "temperature": 0}}

    def first_line(client: httpx.Client, url: str) -> float:
        t0 = time.perf_counter()
        with client.stream("POST", url + "/api/chat", json=body) as r:
            if r.status_code != 200:
                raise BenchError(f"{url}: HTTP {r.status_code}")
            lines = r.iter_lines()
            next(lines)
            took = time.perf_counter() - t0
            for _ in lines:  # the rest of the answer, so the connection is reused
                pass
        return took * 1000

    local: list[float] = []
    hop: list[float] = []
    with httpx.Client(timeout=120) as client:
        for i in range(pairs + 5):  # the first five pairs warm up
            order = (hop_url, local_url) if i % 2 else (local_url, hop_url)
            took = {url: first_line(client, url) for url in order}
            if i >= 5:
                local.append(took[local_url])
                hop.append(took[hop_url])
    added = statistics.median(h - d for h, d in zip(hop, local, strict=True))
    out = {"pairs": pairs, "local_first_line_ms": statistics.median(local),
           "hop_first_line_ms": statistics.median(hop), "added_ms": added}
    print(f"paired first line ({pairs} pairs): local {out['local_first_line_ms']:.1f} ms, "
          f"hop {out['hop_first_line_ms']:.1f} ms, added per hop (median of differences) {added:.2f} ms")
    return out


def isolated_hop(pairs: int) -> dict[str, float]:
    """The hop's own cost: :func:`paired_first_line` on a second pair of daemons whose llama-server is the
    fake one answering at once (tests/fakes), so llama-server's variance does not hide a few ms."""
    from tests.fakes.fake_llama_server import make_launcher
    from tests.fakes.inprocess import make_store

    daemons: list[Daemon] = []
    with tempfile.TemporaryDirectory(prefix="llmman-bench-hop-fake-") as tmp:
        tb, ta = Path(tmp) / "b", Path(tmp) / "a"
        tb.mkdir()
        ta.mkdir()
        make_store(tb, ("tiny",))
        (tb / "bin").mkdir()
        env = {"LLMMAN_LLAMA_SERVER": str(make_launcher(tb / "bin")), "FAKE_REPLY": "a b c d",
               "FAKE_TOKEN_DELAY": "0", "LLMMAN_KEEP_ALIVE": "-1"}
        try:
            b = start_daemon(tb, host="127.0.0.3", extra_env=env)
            daemons.append(b)
            a = start_daemon(ta, host="127.0.0.2", extra_env={**env, "LLMMAN_PEERS": b.url})
            daemons.append(a)
            return paired_first_line(a.url, b.url, pairs, "tiny")
        finally:
            for d in daemons:
                d.stop(signal.SIGTERM)


def serve_fake_peers(count: int) -> None:
    """Serve NODE_DOC on ``count`` loopback ports; print them as one JSON line; run until stdin closes."""
    from aiohttp import web

    async def node(_: web.Request) -> web.Response:
        return web.json_response(NODE_DOC)

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/llmman/node", node)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        ports = []
        for _ in range(count):
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            ports.append(runner.addresses[-1][1])
        print(json.dumps(ports), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await runner.cleanup()

    asyncio.run(serve())


async def time_decisions(ports: list[int], decisions: int) -> dict[str, float]:
    """Probe + rank ``decisions`` times against the fake peers on ``ports``; milliseconds."""
    addresses = tuple(HostAddress("http", "127.0.0.1", p) for p in ports)
    local = NodeView(LOCAL, 8 * 10**9, {}, {REF: 98362432})
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        peers = Peers(session, addresses)
        total: list[float] = []
        ranking: list[float] = []
        for i in range(decisions + 20):
            t0 = time.perf_counter()
            nodes = [local, *await peers.probe()]
            t1 = time.perf_counter()
            rank(REF, model_size(REF, nodes), nodes)
            t2 = time.perf_counter()
            if len(nodes) != len(ports) + 1:
                raise BenchError(f"only {len(nodes) - 1} of {len(ports)} fake peers answered")
            if i >= 20:
                total.append((t2 - t0) * 1000)
                ranking.append((t2 - t1) * 1000)
        await peers.close()
    total.sort()
    return {"peers": len(ports), "median_ms": statistics.median(total),
            "p95_ms": total[int(len(total) * 0.95) - 1], "rank_only_ms": statistics.median(ranking)}


def placement_bench(decisions: int) -> list[dict[str, float]]:
    """The decision time with 1, 3 and 8 fake peers (fresh fake-peer processes for each count)."""
    out = []
    for count in PEER_COUNTS:
        argv = [sys.executable, __file__, "--serve-fake-peers", "1"]
        procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for _ in range(count)]
        try:
            ports = [json.loads(proc.stdout.readline())[0] for proc in procs if proc.stdout is not None]
            out.append(asyncio.run(time_decisions(ports, decisions)))
        finally:
            for proc in procs:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(10)
    print(f"{'peers':>6}{'decision median ms':>20}{'p95 ms':>9}{'rank only ms':>14}")
    for row in out:
        print(f"{row['peers']:>6}{row['median_ms']:>20.3f}{row['p95_ms']:>9.3f}{row['rank_only_ms']:>14.4f}")
    return out


def print_table(comparisons: Sequence[Comparison]) -> None:
    """Medians over rounds: local on b vs through a."""
    head = (f"{'conc':>5}{'local tok/s':>13}{'hop tok/s':>11}{'ratio':>8}{'local TTFT ms':>15}"
            f"{'hop TTFT ms':>13}{'added TTFT ms':>15}{'errors l/h':>12}")
    print(head)
    print("-" * len(head))
    for c in comparisons:
        s = c.summary()
        print(f"{s['conc']:>5}{s['direct_tps']:>13.1f}{s['llmman_tps']:>11.1f}{s['ratio']:>8.3f}"
              f"{s['direct_ttft_ms']:>15.1f}{s['llmman_ttft_ms']:>13.1f}{s['added_ttft_ms']:>15.1f}"
              f"{str(s['direct_errors']) + '/' + str(s['llmman_errors']):>12}")


def main() -> int:
    """Start both daemons, load the model on b, run the comparisons, print the table, stop everything."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per cell (after one warm-up)")
    parser.add_argument("--requests", type=int, default=4, help="streams per worker per round")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--pairs", type=int, default=200, help="direct/hop pairs timed for the added time")
    parser.add_argument("--decisions", type=int, default=300, help="placement decisions timed per peer count")
    parser.add_argument("--placement-only", action="store_true", help="only the placement decision time")
    parser.add_argument("--serve-fake-peers", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake_peers:
        serve_fake_peers(args.serve_fake_peers)
        return 0
    if args.placement_only:
        placement = placement_bench(args.decisions)
        if args.json:
            args.json.write_text(json.dumps({"placement": placement}, indent=2) + "\n")
        return 0
    model_file = Path(os.environ.get("LLMMAN_TEST_MODEL") or DEFAULT_MODEL_FILE)
    if not model_file.is_file():
        print(f"model file missing: {model_file}", file=sys.stderr)
        return 2
    daemons: list[Daemon] = []
    with tempfile.TemporaryDirectory(prefix="llmman-bench-hop-") as tmp:
        try:
            tb, ta = Path(tmp) / "b", Path(tmp) / "a"
            tb.mkdir()
            ta.mkdir()
            Store(tb / "store").build(parse_reference(MODEL), model_file)
            b = start_daemon(tb, host="127.0.0.3", extra_env=ENV)
            daemons.append(b)
            a = start_daemon(ta, host="127.0.0.2", extra_env={**ENV, "LLMMAN_PEERS": b.url})
            daemons.append(a)
            r = httpx.post(b.url + "/api/generate", json={"model": MODEL, "keep_alive": -1}, timeout=300)
            if r.status_code != 200:
                raise BenchError(f"loading {MODEL} on b: HTTP {r.status_code} {r.text[:300]}")
            comparisons = asyncio.run(run_all(a.url, b.url, args.rounds, args.requests))
            if a.children():
                raise BenchError("a started a llama-server of its own: the requests did not hop")
        except BenchError as exc:
            print(f"bench failed: {exc}", file=sys.stderr)
            return 1
        finally:
            for d in daemons:
                d.stop(signal.SIGTERM)
    print_table(comparisons)
    paired = isolated_hop(args.pairs)
    placement = placement_bench(args.decisions)
    if args.json:
        doc = {"hop": [c.summary() for c in comparisons], "paired": paired, "placement": placement}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    errors = sum(int(c.summary()["direct_errors"]) + int(c.summary()["llmman_errors"]) for c in comparisons)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
