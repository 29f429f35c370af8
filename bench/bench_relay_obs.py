"""Benchmark: what observing costs the relay — metrics and the request log on, side by side with both off
(issue 12's proof).

Usage: ``.venv/bin/python bench/bench_relay_obs.py [--quick] [--rounds N] [--conc 1,16,256]
[--dialects openai,ollama] [--json OUT]`` (``make bench-obs``). No model and no llama-server are needed.

Two real ``llmman serve`` daemons run at the same time (own HOME, store, data dir and loopback port,
``tests/integration/daemons.py``), each storing the same tiny synthetic model (``tests/unit/ggufgen.py``),
each in front of its own fake llama-server (``tests/fakes/fake_llama_server.py``) that sends one token
every ``--token-delay`` seconds (default 0.01: 100 tokens/s per stream) with no limit on concurrent
generations, and ``LLMMAN_NUM_PARALLEL=256``, so llmman never queues a stream:

- **on**: the defaults, ``metrics.collect`` and ``log.requests`` on (metrics counted per request, one
  request-log row per request written to ``requests.db`` by the writer thread);
- **off**: ``LLMMAN_METRICS=off`` and ``LLMMAN_LOG_REQUESTS=off``: the relay as it was before observation.

Per dialect (``openai``: ``/v1/chat/completions``, the child's bytes passed through; ``ollama``:
``/api/chat``, SSE translated to NDJSON) and concurrency (1, 16, 256 streams), a warm-up round and
``--rounds`` measured rounds; each round runs both daemons one after the other, the order alternating
(on/off, off/on, ...), so a slow phase of a shared machine hits both. A round: ``conc`` workers each
stream ``--tokens``-token answers (``max_tokens``; the fake's reply is longer) a fixed number of times in a
row (:data:`STREAMS_PER_WORKER`). Figures per round: aggregate tokens/s (every token the streams reported
over the round's wall time) and the median TTFT of its streams (sending to the first content chunk). The
table shows, per cell, medians over rounds: tokens/s on and off, their ratio (the median of per-round
on/off ratios; target >= 0.97, under 3 % cost), TTFT p50 on and off and the added TTFT (median of
per-round on - off; target < 1 ms).

The fake's delay makes the 1-stream cells latency figures (tokens/s there is the fake's pace unless
llmman adds more than the delay per token); at 256 streams the two shared cores are saturated by the
client, llmman and the fake together, so tokens/s there is what the CPU allows, and the cost of observing
shows as a ratio under 1. The fake listens with a backlog of 1024, so 256 streams opened at once are
queued, not refused. Timings are reported, never asserted; the exit
status is non-zero only when a stream or the set-up failed. Results go to ``bench/results-obs-<date>.json``
(``-quick`` in the name for ``--quick``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import signal
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pool import commit
from bench_proxy import REPO, BenchError, RoundResult, Target, run_round
from tests.fakes.fake_llama_server import make_launcher
from tests.fakes.inprocess import make_store
from tests.integration.daemons import Daemon, start_daemon

MODEL = "tiny"
TOKENS = 64
TOKEN_DELAY_S = 0.01
SLOTS = 256
CONCURRENCY = (1, 16, 256)
DIALECTS = ("openai", "ollama")
#: Streams each worker sends in a row per round, by concurrency (a round of a few seconds each).
STREAMS_PER_WORKER = {1: 12, 16: 3, 256: 2}
REPLY = " ".join(f"w{i}" for i in range(200))  # 200 tokens; max_tokens cuts each stream to TOKENS
TARGET_RATIO = 0.97  # under 3 % tokens/s cost
TARGET_ADDED_TTFT_MS = 1.0
CONFIGS = {"on": {}, "off": {"LLMMAN_METRICS": "off", "LLMMAN_LOG_REQUESTS": "off"}}

@contextmanager
def daemons(tmp: Path, delay: float) -> Iterator[dict[str, Daemon]]:
    """One daemon per configuration (:data:`CONFIGS`), each over its own fake; stopped on exit."""
    started: dict[str, Daemon] = {}
    try:
        for name, env in CONFIGS.items():
            root = tmp / name
            root.mkdir(parents=True)
            make_store(root, (MODEL,))
            (root / "bin").mkdir()
            extra = {"LLMMAN_LLAMA_SERVER": str(make_launcher(root / "bin")),
                     "LLMMAN_NUM_PARALLEL": str(SLOTS),
                     "LLMMAN_KEEP_ALIVE": "-1", "LLMMAN_NODE_NAME": f"bench-{name}",
                     "FAKE_REPLY": REPLY, "FAKE_TOKEN_DELAY": str(delay), **env}
            started[name] = start_daemon(root, extra_env=extra)
        yield started
    finally:
        for d in started.values():
            if d.process.poll() is None:
                d.stop(signal.SIGTERM)


def targets(url: str, tokens: int) -> dict[str, Target]:
    """The streamed chat request of each dialect to the daemon at ``url``."""
    messages = [{"role": "user", "content": "Tell me about lighthouses."}]
    return {
        "openai": Target("openai", f"{url}/v1/chat/completions", orjson.dumps({
            "model": MODEL, "messages": messages, "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True}}), "sse"),
        "ollama": Target("ollama", f"{url}/api/chat", orjson.dumps({
            "model": MODEL, "messages": messages, "stream": True,
            "options": {"num_predict": tokens}}), "ndjson"),
    }


@dataclass
class Round(RoundResult):
    """One round of one configuration, with the CPU its daemon spent (every thread: the event loop and
    the request log's writer), from psutil."""

    streams: int = 0
    cpu_s: float = 0.0

    @property
    def cpu_us_per_stream(self) -> float:
        """The daemon's CPU microseconds per stream relayed."""
        return self.cpu_s / self.streams * 1e6 if self.streams else 0.0


def cpu_seconds(d: Daemon) -> float:
    """The daemon process's user + system CPU seconds so far (all threads; not its children)."""
    times = psutil.Process(d.process.pid).cpu_times()
    return float(times.user + times.system)


async def timed_round(session: aiohttp.ClientSession, d: Daemon, target: Target, conc: int,
                      repeat: int) -> Round:
    """:func:`bench_proxy.run_round` with the daemon's CPU time over the round."""
    before = cpu_seconds(d)
    got = await run_round(session, target, conc, repeat)
    return Round(**asdict(got), streams=conc * repeat - got.errors, cpu_s=cpu_seconds(d) - before)


@dataclass
class Cell:
    """One dialect at one concurrency: the warm-up and measured rounds of both configurations."""

    dialect: str
    conc: int
    on: list[Round] = field(default_factory=list)
    off: list[Round] = field(default_factory=list)
    warmup: dict[str, Round] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Medians over rounds; the ratios and added TTFT are medians of per-round figures."""
        pairs = list(zip(self.on, self.off, strict=True))
        ratios = [a.tps / b.tps for a, b in pairs if b.tps > 0]
        added = [a.ttft_ms - b.ttft_ms for a, b in pairs]
        cpu = [a.cpu_us_per_stream / b.cpu_us_per_stream for a, b in pairs if b.cpu_us_per_stream > 0]
        return {
            "dialect": self.dialect, "conc": self.conc, "rounds": len(pairs),
            "on_tps": statistics.median(r.tps for r in self.on),
            "off_tps": statistics.median(r.tps for r in self.off),
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "cost_percent": (1 - statistics.median(ratios)) * 100,
            "on_ttft_ms": statistics.median(r.ttft_ms for r in self.on),
            "off_ttft_ms": statistics.median(r.ttft_ms for r in self.off),
            "added_ttft_ms": statistics.median(added),
            "added_ttft_ms_min": min(added), "added_ttft_ms_max": max(added),
            "on_cpu_us_per_stream": statistics.median(r.cpu_us_per_stream for r in self.on),
            "off_cpu_us_per_stream": statistics.median(r.cpu_us_per_stream for r in self.off),
            "cpu_ratio": statistics.median(cpu) if cpu else 0.0,
            "errors_on": sum(r.errors for r in self.on), "errors_off": sum(r.errors for r in self.off),
            "errors_warmup": sum(r.errors for r in self.warmup.values()),
        }


async def measure(ds: dict[str, Daemon], dialects: Sequence[str], concs: Sequence[int], rounds: int,
                  tokens: int, together: bool = False) -> list[Cell]:
    """Every cell: a warm-up round, then ``rounds`` rounds of both configurations, order alternating;
    with ``together`` both configurations' rounds run at the same time instead (``conc`` streams each)."""
    per_config = {name: targets(d.url, tokens) for name, d in ds.items()}
    timeout = aiohttp.ClientTimeout(total=600)
    # A new loopback connection per request, as bench_proxy.py (and as llmman does to its children).
    async with (aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                      timeout=timeout) as s_on,
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                      timeout=timeout) as s_off):
        sessions = {"on": s_on, "off": s_off}
        cells = []
        for dialect in dialects:
            for conc in concs:
                cell = Cell(dialect, conc)
                repeat = STREAMS_PER_WORKER.get(conc, 2)
                for i in range(rounds + 1):
                    order = ["on", "off"] if i % 2 == 0 else ["off", "on"]
                    if together:
                        both = await asyncio.gather(*(timed_round(sessions[n], ds[n], per_config[n][dialect],
                                                                  conc, repeat) for n in order))
                        got = dict(zip(order, both, strict=True))
                    else:
                        got = {n: await timed_round(sessions[n], ds[n], per_config[n][dialect], conc, repeat)
                               for n in order}
                    if i == 0:
                        cell.warmup = got
                        continue
                    cell.on.append(got["on"])
                    cell.off.append(got["off"])
                    on, off = got["on"], got["off"]
                    print(f"  {dialect:<6} conc {conc:>3} round {i}: on {on.tps:8.1f} tok/s "
                          f"{on.ttft_ms:7.2f} ms | off {off.tps:8.1f} tok/s {off.ttft_ms:7.2f} ms | "
                          f"ratio {on.tps / off.tps:.3f} | CPU us/stream on {on.cpu_us_per_stream:.0f} "
                          f"off {off.cpu_us_per_stream:.0f}"
                          f"{f' | errors {on.errors}/{off.errors}' if on.errors or off.errors else ''}",
                          flush=True)
                cells.append(cell)
        return cells


def print_table(summaries: Sequence[dict[str, Any]]) -> None:
    """The result table (medians over rounds)."""
    head = (f"{'dialect':<8}{'conc':>5}{'on tok/s':>11}{'off tok/s':>11}{'ratio':>8}{'min-max':>13}"
            f"{'on TTFT ms':>12}{'off TTFT ms':>13}{'added ms':>10}{'CPU on':>9}{'CPU off':>9}{'CPU x':>7}"
            f"{'errors on/off':>15}")
    print(head)
    print("-" * len(head))
    for s in summaries:
        print(f"{s['dialect']:<8}{s['conc']:>5}{s['on_tps']:>11.1f}{s['off_tps']:>11.1f}{s['ratio']:>8.3f}"
              f"{s['ratio_min']:>7.3f}-{s['ratio_max']:.3f}{s['on_ttft_ms']:>12.2f}{s['off_ttft_ms']:>13.2f}"
              f"{s['added_ttft_ms']:>10.2f}{s['on_cpu_us_per_stream']:>9.0f}{s['off_cpu_us_per_stream']:>9.0f}"
              f"{s['cpu_ratio']:>7.3f}{str(s['errors_on']) + '/' + str(s['errors_off']):>15}")
    print(f"targets: ratio >= {TARGET_RATIO} (under 3 % tokens/s cost), added TTFT < {TARGET_ADDED_TTFT_MS} "
          "ms (ratio, added TTFT and CPU ratio are medians of per-round values)")


def detail(r: Round) -> dict[str, Any]:
    """One round's figures for the JSON."""
    return asdict(r) | {"tps": r.tps, "cpu_us_per_stream": r.cpu_us_per_stream}


def rows_written(d: Daemon) -> int:
    """The rows the ``on`` daemon's request log has written (its ``llmman_requestlog_rows_total``)."""
    text = httpx.get(d.url + "/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith('llmman_requestlog_rows_total{outcome="written"}'):
            return int(float(line.split()[-1]))
    return 0


def main() -> int:
    """Start the two daemons, run every cell, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one measured round per cell")
    parser.add_argument("--rounds", type=int, help="measured rounds per cell (default 5; --quick 1)")
    parser.add_argument("--conc", default=",".join(map(str, CONCURRENCY)),
                        help="concurrencies, comma-separated")
    parser.add_argument("--dialects", default=",".join(DIALECTS), help="openai, ollama or both")
    parser.add_argument("--tokens", type=int, default=TOKENS, help=f"tokens per stream (default {TOKENS})")
    parser.add_argument("--token-delay", type=float, default=TOKEN_DELAY_S,
                        help=f"the fake's seconds between tokens (default {TOKEN_DELAY_S})")
    parser.add_argument("--together", action="store_true",
                        help="run both configurations' rounds at the same time (conc streams each), so "
                             "the machine's other load hits both alike")
    parser.add_argument("--json", type=Path, help="where to write the results")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    concs = [int(c) for c in args.conc.split(",") if c]
    dialects = [d for d in args.dialects.split(",") if d]
    if any(d not in DIALECTS for d in dialects) or rounds < 1 or not concs or min(concs) < 1 \
            or max(concs) > SLOTS:
        parser.error(f"bad --dialects, --rounds or --conc (1..{SLOTS})")
    today = datetime.date.today().isoformat()
    out_path = args.json or REPO / "bench" / f"results-obs-{today}{'-quick' if args.quick else ''}.json"
    doc: dict[str, Any] = {"date": today, "commit": commit(), "cpus": os.cpu_count(), "rounds": rounds,
                           "tokens": args.tokens, "token_delay_s": args.token_delay, "slots": SLOTS,
                           "streams_per_worker": {c: STREAMS_PER_WORKER.get(c, 2) for c in concs},
                           "configs": CONFIGS, "together": args.together,
                           "load_average_before": os.getloadavg()}
    failed = False
    with tempfile.TemporaryDirectory(prefix="llmman-bench-obs-") as name, daemons(Path(name),
                                                                                   args.token_delay) as ds:
        print(f"on {ds['on'].url} (metrics + request log), off {ds['off'].url} (both off); fake at "
              f"{1 / args.token_delay:g} tokens/s per stream, {args.tokens} tokens a stream; "
              f"a warm-up and {rounds} round(s) per cell"
              f"{', both configurations at once' if args.together else ''}; {os.cpu_count()} CPUs",
              flush=True)
        try:
            cells = asyncio.run(measure(ds, dialects, concs, rounds, args.tokens, args.together))
            summaries = [c.summary() for c in cells]
            print()
            print_table(summaries)
            doc["summary"] = summaries
            doc["rounds_detail"] = [{"dialect": c.dialect, "conc": c.conc,
                                     "warmup": {k: detail(r) for k, r in c.warmup.items()},
                                     "on": [detail(r) for r in c.on], "off": [detail(r) for r in c.off]}
                                    for c in cells]
            doc["on_rows_written"] = rows_written(ds["on"])
            off_metrics = httpx.get(ds["off"].url + "/metrics", timeout=30).status_code
            doc["off_metrics_status"] = off_metrics
            print(f"the on daemon's request log wrote {doc['on_rows_written']} rows; the off daemon's "
                  f"/metrics answers {off_metrics}")
            errors = sum(s["errors_on"] + s["errors_off"] + s["errors_warmup"] for s in summaries)
            if errors:
                print(f"FAILED: {errors} stream(s) failed (see ERROR lines above)", file=sys.stderr)
                failed = True
        except (BenchError, aiohttp.ClientError, httpx.HTTPError, OSError, TimeoutError) as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            doc["failed"] = str(exc)
            failed = True
    doc["load_average_after"] = os.getloadavg()
    out_path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"results: {out_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
