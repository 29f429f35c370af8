"""Benchmark: what llmman's proxy adds to streaming chat, measured against the very same llama-server child.

Usage: ``.venv/bin/python bench/bench_proxy.py [--rounds N] [--requests K] [--json OUT] [--profile OUT]``
(``make bench`` runs it with the default model). It starts a private ``llmman serve`` (own HOME, store and
loopback port; ``LLMMAN_NUM_PARALLEL=16``, ``LLMMAN_CONTEXT_LENGTH=512``), builds SmolLM2-135M into its store
(``LLMMAN_TEST_MODEL`` or ``~/.cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf``), loads it through llmman
and reads the child's ``--port`` from its command line, so "direct" is exactly the process llmman proxies to.

Two routes, each at 1 and 16 concurrent streams:

- ``openai``: llmman ``/v1/chat/completions`` (byte-for-byte passthrough) vs direct ``/v1/chat/completions``,
  identical bodies: ``max_tokens`` 64, temperature 0, ``ignore_eos`` (every stream yields exactly 64 tokens).
- ``ollama``: llmman ``/api/chat`` (SSE translated to NDJSON; ``options.num_predict`` 64, temperature 0) vs
  direct ``/v1/chat/completions`` with the same limits. Ollama cannot pass ``ignore_eos``, so EOS may end a
  stream early; tokens are counted from what each stream reports (``eval_count`` / ``usage``), so tokens/s
  stays comparable.

A round runs ``conc`` workers, each sending ``--requests`` streams one after another; tokens/s is the round's
total tokens over its wall time, TTFT the time from sending a request to its first non-empty content. Every
round measures both targets back to back (the order alternates: A/B, B/A, ...), a warm-up round is thrown
away, and the table shows medians over rounds, the ratio being the median of per-round llmman/direct ratios.
Timings are only reported, never asserted: the exit status is non-zero only if a request or the set-up failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import httpx
import orjson
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from tests.integration.daemons import Daemon, start_daemon  # noqa: E402

from llmman.refs import parse_reference  # noqa: E402
from llmman.store import Store  # noqa: E402

MODEL = "smollm2:135m"
DEFAULT_MODEL_FILE = Path.home() / ".cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_TOKENS = 64
CONCURRENCY = (1, 16)
MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]
TARGET_RATIO = 0.98
TARGET_ADDED_TTFT_MS = 5.0


class BenchError(RuntimeError):
    """A request failed or the set-up went wrong; the benchmark exits non-zero."""


@dataclass(frozen=True)
class Target:
    """One side of a comparison: where to POST, what body, and how the stream is framed."""

    name: str
    url: str
    body: bytes
    dialect: str  # "sse" (OpenAI chunks) or "ndjson" (Ollama lines)


@dataclass
class StreamResult:
    """One streamed request: seconds to the first content token and tokens the server said it produced."""

    ttft: float
    tokens: int


@dataclass
class RoundResult:
    """One round of one target: aggregate tokens/s and the median TTFT of its streams."""

    tokens: int
    wall: float
    ttft_ms: float
    errors: int = 0

    @property
    def tps(self) -> float:
        """Aggregate tokens per second of the round."""
        return self.tokens / self.wall if self.wall > 0 else 0.0


@dataclass
class Comparison:
    """Per-round figures of llmman vs direct for one route at one concurrency."""

    route: str
    conc: int
    direct: list[RoundResult] = field(default_factory=list)
    llmman: list[RoundResult] = field(default_factory=list)
    warmup_errors: int = 0

    def summary(self) -> dict[str, float | int | str]:
        """Medians over rounds; the ratio and added TTFT are medians of per-round differences."""
        ratios = [b.tps / a.tps for a, b in zip(self.direct, self.llmman, strict=True) if a.tps > 0]
        added = [b.ttft_ms - a.ttft_ms for a, b in zip(self.direct, self.llmman, strict=True)]
        return {
            "route": self.route,
            "conc": self.conc,
            "rounds": len(self.direct),
            "direct_tps": statistics.median(r.tps for r in self.direct),
            "llmman_tps": statistics.median(r.tps for r in self.llmman),
            "ratio": statistics.median(ratios) if ratios else 0.0,
            "ratio_min": min(ratios) if ratios else 0.0,
            "ratio_max": max(ratios) if ratios else 0.0,
            "direct_ttft_ms": statistics.median(r.ttft_ms for r in self.direct),
            "llmman_ttft_ms": statistics.median(r.ttft_ms for r in self.llmman),
            "added_ttft_ms": statistics.median(added),
            "direct_tokens_per_round": statistics.median(r.tokens for r in self.direct),
            "llmman_tokens_per_round": statistics.median(r.tokens for r in self.llmman),
            "direct_errors": sum(r.errors for r in self.direct),
            "llmman_errors": sum(r.errors for r in self.llmman),
            "warmup_errors": self.warmup_errors,
        }


def openai_body(*, ignore_eos: bool) -> bytes:
    """The OpenAI streaming body (same bytes to llmman and to llama-server)."""
    body: dict[str, object] = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    return orjson.dumps(body)


def ollama_body() -> bytes:
    """The Ollama ``/api/chat`` streaming body with the same limits as :func:`openai_body`."""
    return orjson.dumps({
        "model": MODEL,
        "messages": MESSAGES,
        "stream": True,
        "options": {"num_predict": MAX_TOKENS, "temperature": 0},
    })


def _content_sse(line: bytes) -> tuple[bool, int | None]:
    """For one SSE line: (does it carry non-empty content, completion tokens if it reports usage)."""
    if not line.startswith(b"data:"):
        return False, None
    payload = line[5:].strip()
    if not payload or payload == b"[DONE]":
        return False, None
    chunk = orjson.loads(payload)
    if "error" in chunk:
        raise BenchError(f"error in stream: {payload[:300]!r}")
    usage = chunk.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    choices = chunk.get("choices") or []
    content = bool(choices and (choices[0].get("delta") or {}).get("content"))
    return content, tokens if isinstance(tokens, int) else None


def _content_ndjson(line: bytes) -> tuple[bool, int | None]:
    """For one NDJSON line: (does it carry non-empty content, ``eval_count`` if it is the final line)."""
    line = line.strip()
    if not line:
        return False, None
    chunk = orjson.loads(line)
    if "error" in chunk:
        raise BenchError(f"error in stream: {line[:300]!r}")
    content = bool((chunk.get("message") or {}).get("content"))
    tokens = chunk.get("eval_count") if chunk.get("done") else None
    return content, tokens if isinstance(tokens, int) else None


async def one_stream(session: aiohttp.ClientSession, target: Target) -> StreamResult:
    """Send one streaming request and read it to the end.

    Lines are decoded only until the first content token and afterwards only when they may carry the token
    count, so the client spends as little of the shared CPU as possible and the same for both targets.

    Raises:
        BenchError: a non-200 status, an error in the stream, or a stream with no content.
    """
    parse = _content_sse if target.dialect == "sse" else _content_ndjson
    marker = b'"usage"' if target.dialect == "sse" else b'"done":true'
    ttft: float | None = None
    tokens: int | None = None
    chunks = 0
    start = time.perf_counter()
    async with session.post(target.url, data=target.body,
                            headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            raise BenchError(f"{target.name}: HTTP {resp.status}: {(await resp.read())[:300]!r}")
        async for line in resp.content:
            if ttft is None:
                content, count = parse(line)
                if content:
                    ttft = time.perf_counter() - start
                    chunks += 1
            else:
                chunks += 1
                count = parse(line)[1] if marker in line else None
            if count is not None:
                tokens = count
    if ttft is None:
        raise BenchError(f"{target.name}: the stream carried no content")
    return StreamResult(ttft=ttft, tokens=tokens if tokens is not None else chunks)


async def run_round(session: aiohttp.ClientSession, target: Target, conc: int, requests: int) -> RoundResult:
    """``conc`` workers, each streaming ``requests`` times in a row; returns the round's aggregate figures."""

    async def worker() -> list[StreamResult | str]:
        out: list[StreamResult | str] = []
        for _ in range(requests):
            try:
                out.append(await one_stream(session, target))
            except (BenchError, aiohttp.ClientError) as exc:  # counted, reported, and the exit status is 1
                out.append(f"{target.name} {target.url}: {type(exc).__name__}: {exc}")
        return out

    start = time.perf_counter()
    per_worker = await asyncio.gather(*(worker() for _ in range(conc)))
    wall = time.perf_counter() - start
    results = [r for rs in per_worker for r in rs if isinstance(r, StreamResult)]
    errors = [r for rs in per_worker for r in rs if isinstance(r, str)]
    for message in sorted(set(errors)):
        print(f"  ERROR ({errors.count(message)}x): {message}", file=sys.stderr, flush=True)
    if not results:
        raise BenchError(f"every stream of a {target.name} round failed")
    return RoundResult(
        tokens=sum(r.tokens for r in results),
        wall=wall,
        ttft_ms=statistics.median(r.ttft for r in results) * 1000,
        errors=len(errors),
    )


async def compare(route: str, conc: int, direct: Target, llmman: Target,
                  sessions: dict[str, aiohttp.ClientSession], rounds: int, requests: int) -> Comparison:
    """Warm-up, then ``rounds`` interleaved rounds of direct and llmman (alternating which goes first)."""
    result = Comparison(route=route, conc=conc)
    for i in range(rounds + 1):
        order = [direct, llmman] if i % 2 == 0 else [llmman, direct]
        got = {t.name: await run_round(sessions[t.name], t, conc, requests) for t in order}
        if i == 0:  # warm-up: slots, prompt cache; only its errors are kept
            result.warmup_errors = sum(r.errors for r in got.values())
            continue
        result.direct.append(got[direct.name])
        result.llmman.append(got[llmman.name])
        d, m = got[direct.name], got[llmman.name]
        print(f"  {route:<6} conc {conc:>2} round {i}: direct {d.tps:7.1f} tok/s {d.ttft_ms:7.1f} ms | "
              f"llmman {m.tps:7.1f} tok/s {m.ttft_ms:7.1f} ms | ratio {m.tps / d.tps:.3f}"
              f"{f' | errors {d.errors}/{m.errors}' if d.errors or m.errors else ''}", flush=True)
    return result


async def run_all(daemon_url: str, direct_url: str, rounds: int, requests: int,
                  routes: Sequence[str], concurrency: Sequence[int] = CONCURRENCY) -> list[Comparison]:
    """Every route at every concurrency; one aiohttp session per target (llmman, direct)."""
    openai_eos = openai_body(ignore_eos=True)
    openai_plain = openai_body(ignore_eos=False)
    pairs = {
        "openai": (Target("direct", f"{direct_url}/v1/chat/completions", openai_eos, "sse"),
                   Target("llmman", f"{daemon_url}/v1/chat/completions", openai_eos, "sse")),
        "ollama": (Target("direct", f"{direct_url}/v1/chat/completions", openai_plain, "sse"),
                   Target("llmman", f"{daemon_url}/api/chat", ollama_body(), "ndjson")),
    }
    timeout = aiohttp.ClientTimeout(total=600)

    def connector() -> aiohttp.TCPConnector:
        # A new loopback connection per request, for both targets: llama-server closes the connection
        # after a streamed answer although it advertised keep-alive, so reusing it fails ("Server
        # disconnected" / "Can not write request body").
        return aiohttp.TCPConnector(limit=max(64, *concurrency), force_close=True)

    async with (aiohttp.ClientSession(connector=connector(), timeout=timeout) as s_direct,
                aiohttp.ClientSession(connector=connector(), timeout=timeout) as s_llmman):
        sessions = {"direct": s_direct, "llmman": s_llmman}
        out = []
        for route in routes:
            direct, llmman = pairs[route]
            for conc in concurrency:
                out.append(await compare(route, conc, direct, llmman, sessions, rounds, requests))
        return out


def print_table(comparisons: Sequence[Comparison]) -> None:
    """The result table (medians over rounds)."""
    head = (f"{'route':<7}{'conc':>5}{'direct tok/s':>14}{'llmman tok/s':>14}{'ratio':>8}"
            f"{'direct TTFT ms':>16}{'llmman TTFT ms':>16}{'added TTFT ms':>15}{'errors d/l':>12}")
    print(head)
    print("-" * len(head))
    for c in comparisons:
        s = c.summary()
        print(f"{s['route']:<7}{s['conc']:>5}{s['direct_tps']:>14.1f}{s['llmman_tps']:>14.1f}{s['ratio']:>8.3f}"
              f"{s['direct_ttft_ms']:>16.1f}{s['llmman_ttft_ms']:>16.1f}{s['added_ttft_ms']:>15.1f}"
              f"{str(s['direct_errors']) + '/' + str(s['llmman_errors']):>12}")
    print(f"targets: ratio >= {TARGET_RATIO}, added TTFT < {TARGET_ADDED_TTFT_MS} ms "
          "(ratio and added TTFT are medians of per-round values)")


def child_port(daemon: Daemon) -> tuple[psutil.Process, int]:
    """The daemon's only llama-server child and the ``--port`` on its command line."""
    children = daemon.children()
    if len(children) != 1:
        raise BenchError(f"expected one llama-server child, found {len(children)}")
    argv = children[0].cmdline()
    try:
        return children[0], int(argv[argv.index("--port") + 1])
    except (ValueError, IndexError) as exc:
        raise BenchError(f"no --port in the child's command line: {argv}") from exc


def start_profiler(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """Start ``py-spy record`` on the daemon (if py-spy is installed); stopped with SIGINT at the end."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.access(spy, os.X_OK):
        print("py-spy not found: no profile", file=sys.stderr)
        return None
    formats = {".json": "speedscope", ".txt": "raw", ".folded": "raw"}
    fmt = formats.get(out.suffix, "flamegraph")
    return subprocess.Popen([spy, "record", "-p", str(pid), "-o", str(out), "-f", fmt, "-r", "200",
                             "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main() -> int:
    """Set up the daemon and model, run the comparisons, print the table, tear everything down."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per cell (after one warm-up)")
    parser.add_argument("--requests", type=int, default=2,
                        help="streams each concurrent worker sends in a row per round")
    parser.add_argument("--routes", default="openai,ollama", help="comma-separated subset of openai,ollama")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the figures to this JSON file")
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)),
                        help="concurrent streams per cell, comma-separated (default 1,16; gpu.sh: 1,16,256)")
    parser.add_argument("--parallel", type=int, default=16, help="the daemon's LLMMAN_NUM_PARALLEL (slots)")
    parser.add_argument("--profile", type=Path, metavar="OUT",
                        help="py-spy record the daemon during the run (.svg flamegraph, .txt collapsed, "
                             ".json speedscope)")
    args = parser.parse_args()
    routes = [r for r in args.routes.split(",") if r]
    try:
        concurrency = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
    except ValueError:
        concurrency = ()
    if any(r not in ("openai", "ollama") for r in routes) or args.rounds < 1 or args.requests < 1 \
            or not concurrency or min(concurrency) < 1 or args.parallel < 1:
        parser.error("bad --routes, --rounds, --requests, --concurrency or --parallel")

    model_file = Path(os.environ.get("LLMMAN_TEST_MODEL") or DEFAULT_MODEL_FILE)
    if not model_file.is_file():
        print(f"model file missing: {model_file} (run scripts/setup.sh --model)", file=sys.stderr)
        return 2

    failed = False
    children: list[psutil.Process] = []
    with tempfile.TemporaryDirectory(prefix="llmman-bench-") as tmp_name:
        tmp = Path(tmp_name)
        Store(tmp / "store").build(parse_reference(MODEL), model_file)
        extra = {"LLMMAN_NUM_PARALLEL": str(args.parallel), "LLMMAN_CONTEXT_LENGTH": "512"}
        if os.environ.get("LLMMAN_LLAMA_SERVER"):  # bench/gpu.sh: the CUDA build
            extra["LLMMAN_LLAMA_SERVER"] = os.environ["LLMMAN_LLAMA_SERVER"]
        daemon = start_daemon(tmp, extra_env=extra)
        profiler: subprocess.Popen[bytes] | None = None
        try:
            load = httpx.post(f"{daemon.url}/api/generate", json={"model": MODEL, "keep_alive": -1},
                              timeout=300)
            if load.status_code != 200:
                raise BenchError(f"load failed: HTTP {load.status_code}: {load.text[:300]}")
            child, port = child_port(daemon)
            children = [child]
            direct_url = f"http://127.0.0.1:{port}"
            print(f"llmman {daemon.url} (pid {daemon.process.pid}) -> llama-server {direct_url} "
                  f"(pid {child.pid}); {os.cpu_count()} CPUs, rounds {args.rounds}, "
                  f"requests/worker {args.requests}, max_tokens {MAX_TOKENS}", flush=True)
            if args.profile:
                profiler = start_profiler(daemon.process.pid, args.profile)
            comparisons = asyncio.run(run_all(daemon.url, direct_url, args.rounds, args.requests, routes,
                                              concurrency))
            print()
            print_table(comparisons)
            errors = sum(c.warmup_errors + sum(r.errors for r in c.direct + c.llmman) for c in comparisons)
            if errors:
                print(f"FAILED: {errors} stream(s) failed (see ERROR lines above)", file=sys.stderr)
                failed = True
            if args.json:
                args.json.write_text(orjson.dumps({
                    "cpus": os.cpu_count(),
                    "rounds": args.rounds,
                    "requests_per_worker": args.requests,
                    "max_tokens": MAX_TOKENS,
                    "concurrency": list(concurrency),
                    "parallel": args.parallel,
                    "llama_server": os.environ.get("LLMMAN_LLAMA_SERVER", ""),
                    "summary": [c.summary() for c in comparisons],
                    "rounds_detail": [{"route": c.route, "conc": c.conc,
                                       "direct": [asdict(r) | {"tps": r.tps} for r in c.direct],
                                       "llmman": [asdict(r) | {"tps": r.tps} for r in c.llmman]}
                                      for c in comparisons],
                }, option=orjson.OPT_INDENT_2).decode())
        except (BenchError, aiohttp.ClientError, httpx.HTTPError, OSError, TimeoutError) as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            failed = True
        finally:
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                try:
                    profiler.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    profiler.kill()
            children = children or daemon.children()
            code = daemon.stop()
            alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
            if alive:
                print(f"FAILED: llama-server left running after the daemon stopped: {[c.pid for c in alive]}",
                      file=sys.stderr)
                for c in alive:
                    c.kill()
                failed = True
            if code != 0:
                print(f"FAILED: llmman serve exited with {code}:\n{daemon.log_text()[-2000:]}",
                      file=sys.stderr)
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
