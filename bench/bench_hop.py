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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
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

from llmman.refs import parse_reference
from llmman.store import Store

CONCURRENCY = (1, 8)
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
    args = parser.parse_args()
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
    if args.json:
        args.json.write_text(json.dumps([c.summary() for c in comparisons], indent=2) + "\n")
    errors = sum(int(c.summary()["direct_errors"]) + int(c.summary()["llmman_errors"]) for c in comparisons)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
