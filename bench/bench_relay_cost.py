"""Benchmark: the daemon's CPU per token relayed, one event per upstream read (issue 17, target 1).

Usage: ``.venv/bin/python bench/bench_relay_cost.py [--quick] [--rounds N] [--conc 256] [--tokens N]
[--token-delay S] [--paths openai,ollama,hop,direct] [--src DIR] [--against DIR] [--profile DIR]
[--json OUT]`` (``make bench-relay``).
No model and no llama-server are needed.

Two real ``llmman serve`` daemons (own HOME, store and loopback address, ``tests/integration/daemons.py``):
**b** stores a tiny synthetic model (``tests/unit/ggufgen.py``) and runs the fake llama-server
(``tests/fakes/fake_llama_server.py``) as its child, with ``LLMMAN_NUM_PARALLEL`` = the concurrency so
nothing queues; **a** stores nothing and has b as its peer, so everything sent to a is forwarded to b. The
fake writes every SSE event with its own ``write`` + ``flush`` (one HTTP chunk, Nagle off), as a GPU
llama-server does, so each read of the child's socket normally carries one event. Four paths, side by
side in one run (the order rotates each round, so a slow phase of a shared machine hits them all):

- ``openai``: ``/v1/chat/completions`` stream on b, the child's bytes passed through (the model name
  rewritten); CPU of b.
- ``ollama``: ``/api/chat`` stream on b, SSE translated to NDJSON; CPU of b.
- ``hop``: ``/v1/chat/completions`` stream sent to a, forwarded to b; CPU of a (the forwarding node:
  what the hop adds), b's shown too.
- ``direct``: the same OpenAI request straight to the fake (reference tokens/s; no daemon CPU).

A round: ``--conc`` streams at once, each of ``--tokens`` tokens (``max_tokens`` / ``num_predict``; the
fake's reply is longer). CPU is psutil's ``cpu_times`` user + system of the daemon process only (every
thread, not the fake, not this client) over the round, divided by the tokens the streams reported
(``usage`` / ``eval_count``): **µs per token**, which includes each request's own cost spread over its
tokens (more ``--tokens``, less of it). ``reads/tok`` and ``writes/tok`` are the daemon's read and write
system calls over the round (``/proc/PID/io`` ``syscr``/``syscw``; uvloop reads and writes sockets with
plain ``read``/``write``) per token: about 1 read per token means one event per upstream read held.
The table shows medians over rounds after a warm-up round. Targets: <= 10 µs passthrough, <= 15 µs Ollama,
<= 10 µs on the forwarding node. Timings are reported, never asserted; the exit status is non-zero only
when a stream or the set-up failed. Results go to ``bench/results-relay-cost-<date>.json``
(``-quick`` for ``--quick``). ``--src DIR`` runs the daemons from another checkout's ``src``;
``--against DIR`` adds a second pair (side ``against``, on 127.0.0.4/5) from another checkout, each path's
rounds of both sides interleaved in the same run: a before/after that the machine's other load hits
alike. ``µs/read`` is the measured daemon's CPU per read system call, a figure that moves less with how
many events a read happened to carry (a loaded machine makes the daemon lag, and its reads carry more).
``--profile DIR`` records py-spy (``.venv/bin/py-spy``) on the measured daemon during each path's rounds:
folded stacks per path and round (``-f raw``; flamegraph.pl and speedscope read them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
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
from bench_proxy import REPO, BenchError, RoundResult, Target, child_port, run_round
from tests.fakes.fake_llama_server import make_launcher
from tests.fakes.inprocess import make_store
from tests.integration.daemons import Daemon, start_daemon

MODEL = "tiny"
TOKENS = 256
CONC = 256
#: The fake's seconds between a stream's tokens: 20 tokens/s a stream, 5,120 tokens/s over 256 streams, slow
#: enough that the daemon reads each event on its own (0, unpaced, makes the fake's writes pile up
#: in the socket: 20-50 events a read, the cheap case this benchmark is not about).
TOKEN_DELAY_S = 0.05
PATHS = ("openai", "ollama", "hop", "direct")
REPLY = " ".join(f"w{i}" for i in range(2048))  # longer than any stream; max_tokens cuts it
TARGETS_US = {"openai": 10.0, "ollama": 15.0, "hop": 10.0}
#: Which daemon's CPU each path measures ("a" forwards, "b" serves).
MEASURED = {"openai": "b", "ollama": "b", "hop": "a"}


@contextmanager
def daemons(tmp: Path, conc: int, delay: float, src: Path | None,
            hosts: tuple[str, str] = ("127.0.0.2", "127.0.0.3")) -> Iterator[dict[str, Daemon]]:
    """b (the fake as its child) and a (b as its only peer, nothing stored), on ``hosts`` (a's, b's),
    run from ``src`` (None: this checkout); stopped on exit."""
    started: dict[str, Daemon] = {}
    common = {"LLMMAN_NUM_PARALLEL": str(conc), "LLMMAN_KEEP_ALIVE": "-1",
              **({"PYTHONPATH": str(src.resolve())} if src is not None else {})}
    try:
        root = tmp / "b"
        root.mkdir(parents=True)
        make_store(root, (MODEL,))
        (root / "bin").mkdir()
        started["b"] = start_daemon(root, host=hosts[1], extra_env={
            **common, "LLMMAN_LLAMA_SERVER": str(make_launcher(root / "bin")), "LLMMAN_NODE_NAME": "bench-b",
            "FAKE_REPLY": REPLY, "FAKE_TOKEN_DELAY": str(delay)})
        root = tmp / "a"
        root.mkdir(parents=True)
        started["a"] = start_daemon(root, host=hosts[0], extra_env={
            **common, "LLMMAN_NODE_NAME": "bench-a", "LLMMAN_PEERS": started["b"].url})
        yield started
    finally:
        for d in started.values():
            if d.process.poll() is None:
                d.stop(signal.SIGTERM)


def targets(a: str, b: str, direct: str, tokens: int) -> dict[str, Target]:
    """The streamed chat request of each path."""
    messages = [{"role": "user", "content": "Tell me about lighthouses."}]
    openai = orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": tokens, "stream": True,
                           "stream_options": {"include_usage": True}})
    return {
        "openai": Target("openai", f"{b}/v1/chat/completions", openai, "sse"),
        "ollama": Target("ollama", f"{b}/api/chat", orjson.dumps({
            "model": MODEL, "messages": messages, "stream": True, "options": {"num_predict": tokens}}),
            "ndjson"),
        "hop": Target("hop", f"{a}/v1/chat/completions", openai, "sse"),
        "direct": Target("direct", f"{direct}/v1/chat/completions", openai, "sse"),
    }


@dataclass
class Usage:
    """A process's CPU seconds and read/write system calls so far."""

    cpu_s: float
    reads: int
    writes: int

    @classmethod
    def of(cls, pid: int) -> Usage:
        """``pid``'s user + system CPU (all threads, not its children) and its ``syscr``/``syscw``."""
        times = psutil.Process(pid).cpu_times()
        io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        return cls(float(times.user + times.system), int(io["syscr"]), int(io["syscw"]))

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.cpu_s - other.cpu_s, self.reads - other.reads, self.writes - other.writes)


@dataclass
class Round(RoundResult):
    """One round of one path with what each daemon spent over it."""

    spent: dict[str, Usage] = field(default_factory=dict)

    def us_per_token(self, node: str) -> float:
        """``node``'s CPU microseconds per token relayed."""
        return self.spent[node].cpu_s / self.tokens * 1e6 if self.tokens else 0.0

    def us_per_read(self, node: str) -> float:
        """``node``'s CPU microseconds per read system call (a figure that does not move with how many
        events each read happened to carry)."""
        spent = self.spent[node]
        return spent.cpu_s / spent.reads * 1e6 if spent.reads else 0.0

    def per_token(self, node: str, what: str) -> float:
        """``node``'s ``reads`` or ``writes`` per token."""
        return float(getattr(self.spent[node], what)) / self.tokens if self.tokens else 0.0


async def timed_round(session: aiohttp.ClientSession, ds: dict[str, Daemon], target: Target,
                      conc: int) -> Round:
    """:func:`bench_proxy.run_round` (one stream per worker) with each daemon's usage over it."""
    pids = {name: d.process.pid for name, d in ds.items()}
    before = {name: Usage.of(pid) for name, pid in pids.items()}
    got = await run_round(session, target, conc, 1)
    return Round(**asdict(got), spent={name: Usage.of(pid) - before[name] for name, pid in pids.items()})


@dataclass
class Side:
    """One set of daemons (a and b) and the address of b's fake; ``label`` names it in the table."""

    label: str
    ds: dict[str, Daemon]
    direct: str


@dataclass
class Cell:
    """One path of one side: its warm-up and measured rounds."""

    path: str
    side: str = "this"
    rounds: list[Round] = field(default_factory=list)
    warmup: Round | None = None

    def summary(self) -> dict[str, Any]:
        """Medians over the measured rounds."""
        out: dict[str, Any] = {"path": self.path, "side": self.side, "rounds": len(self.rounds),
                               "tps": statistics.median(r.tps for r in self.rounds),
                               "tokens_per_round": statistics.median(r.tokens for r in self.rounds),
                               "ttft_ms": statistics.median(r.ttft_ms for r in self.rounds),
                               "errors": sum(r.errors for r in self.rounds),
                               "errors_warmup": self.warmup.errors if self.warmup else 0}
        for node in ("a", "b"):
            out[f"{node}_us_per_token"] = statistics.median(r.us_per_token(node) for r in self.rounds)
            for what in ("reads", "writes"):
                per = [r.per_token(node, what) for r in self.rounds]
                out[f"{node}_{what}_per_token"] = statistics.median(per)
        measured = MEASURED.get(self.path)
        out["measured"] = measured
        out["us_per_token"] = out[f"{measured}_us_per_token"] if measured else None
        out["us_per_read"] = statistics.median(r.us_per_read(measured) for r in self.rounds) if measured \
            else None
        out["target_us"] = TARGETS_US.get(self.path)
        return out


def wait_for_hop(a: str, timeout: float = 60.0) -> None:
    """Return once a forwards a request for :data:`MODEL` (its first probe of b has listed it).

    Raises:
        BenchError: still not forwarded after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    while (answer := httpx.post(a + "/v1/chat/completions", json=body, timeout=30)).status_code != 200:
        if time.monotonic() > deadline:
            raise BenchError(f"a does not forward to b: HTTP {answer.status_code} {answer.text[:300]}")
        time.sleep(0.2)  # polling a condition with a deadline (a's view of b)


def prepared(label: str, ds: dict[str, Daemon]) -> Side:
    """``ds`` with the model loaded on b and a forwarding to it, as a :class:`Side`.

    Raises:
        BenchError: the load failed or a does not forward.
    """
    warm = httpx.post(ds["b"].url + "/api/generate", json={"model": MODEL, "keep_alive": -1}, timeout=120)
    if warm.status_code != 200:
        raise BenchError(f"loading {MODEL} on b: HTTP {warm.status_code} {warm.text[:300]}")
    wait_for_hop(ds["a"].url)
    _, port = child_port(ds["b"])
    return Side(label, ds, f"http://127.0.0.1:{port}")


def start_profiler(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """``py-spy record`` on ``pid`` into ``out`` (folded stacks), or None without py-spy."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.access(spy, os.X_OK):
        print("py-spy not found: no profile", file=sys.stderr)
        return None
    return subprocess.Popen([spy, "record", "-p", str(pid), "-o", str(out), "-f", "raw", "-r", "250",
                             "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def measure(sides: Sequence[Side], paths: Sequence[str], conc: int, rounds: int, tokens: int,
                  profile: Path | None) -> list[Cell]:
    """A warm-up round of every path of every side, then ``rounds`` rounds of each, the order rotating
    (so the sides' rounds of a path interleave: a slow phase of the machine hits both)."""
    per_side = {side.label: targets(side.ds["a"].url, side.ds["b"].url, side.direct, tokens)
                for side in sides}
    by_label = {side.label: side for side in sides}
    runs = [(side.label, p) for p in paths for side in sides if p != "direct" or side is sides[0]]
    cells = {run: Cell(run[1], run[0]) for run in runs}
    # A new loopback connection per request, as clients of llmman mostly do (and as bench_proxy.py).
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for i in range(rounds + 1):
            order = runs[i % len(runs):] + runs[:i % len(runs)]
            for label, path in order:
                ds = by_label[label].ds
                node = MEASURED.get(path, "b")
                spy = start_profiler(ds[node].process.pid, profile / f"{path}-{label}-{i}.folded") \
                    if profile is not None and i > 0 else None
                got = await timed_round(session, ds, per_side[label][path], conc)
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(60)
                if i == 0:
                    cells[label, path].warmup = got
                    continue
                cells[label, path].rounds.append(got)
                print(f"  round {i} {path:<7}{label:>8} {got.tps:9.0f} tok/s  "
                      f"a {got.us_per_token('a'):6.1f} µs/tok  "
                      f"b {got.us_per_token('b'):6.1f} µs/tok  reads/tok a {got.per_token('a', 'reads'):.2f} "
                      f"b {got.per_token('b', 'reads'):.2f}"
                      f"{f'  errors {got.errors}' if got.errors else ''}", flush=True)
    return [cells[run] for run in runs]


def print_table(summaries: Sequence[dict[str, Any]]) -> None:
    """The result table (medians over rounds)."""
    head = (f"{'path':<8}{'side':>8}{'tok/s':>10}{'µs/tok':>9}{'target':>8}{'µs/read':>9}{'a µs/tok':>10}"
            f"{'b µs/tok':>10}"
            f"{'a rd/tok':>10}{'b rd/tok':>10}{'a wr/tok':>10}{'b wr/tok':>10}{'TTFT ms':>9}{'errors':>8}")
    print(head)
    print("-" * len(head))
    for s in summaries:
        us = f"{s['us_per_token']:.1f}" if s["us_per_token"] is not None else "-"
        target = f"<={s['target_us']:g}" if s["target_us"] is not None else "-"
        per_read = f"{s['us_per_read']:.1f}" if s["us_per_read"] is not None else "-"
        print(f"{s['path']:<8}{s['side']:>8}{s['tps']:>10.0f}{us:>9}{target:>8}{per_read:>9}"
              f"{s['a_us_per_token']:>10.1f}"
              f"{s['b_us_per_token']:>10.1f}{s['a_reads_per_token']:>10.2f}{s['b_reads_per_token']:>10.2f}"
              f"{s['a_writes_per_token']:>10.2f}{s['b_writes_per_token']:>10.2f}{s['ttft_ms']:>9.1f}"
              f"{s['errors']:>8}")
    print("µs/tok: the measured daemon's CPU per token (openai, ollama: b; hop: a, the forwarding node); "
          "µs/read: the same per read system call")


def detail(r: Round) -> dict[str, Any]:
    """One round's figures for the JSON."""
    return {"tokens": r.tokens, "wall": r.wall, "tps": r.tps, "ttft_ms": r.ttft_ms, "errors": r.errors,
            **{f"{n}_{k}": v for n, u in r.spent.items() for k, v in asdict(u).items()}}


def main() -> int:
    """Start the two daemons, run every path, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one measured round, 64 tokens a stream")
    parser.add_argument("--rounds", type=int, help="measured rounds per path (default 3; --quick 1)")
    parser.add_argument("--conc", type=int, default=CONC, help=f"concurrent streams (default {CONC})")
    parser.add_argument("--tokens", type=int, help=f"tokens per stream (default {TOKENS}; --quick 64)")
    parser.add_argument("--token-delay", type=float, default=TOKEN_DELAY_S,
                        help=f"the fake's seconds between tokens (default {TOKEN_DELAY_S:g}; 0 = as fast as "
                             "it writes)")
    parser.add_argument("--paths", default=",".join(PATHS), help="some of " + ",".join(PATHS))
    parser.add_argument("--src", type=Path,
                        help="run the daemons from this checkout's src/ (PYTHONPATH), e.g. a worktree of the "
                             "commit before a change, for a before/after on the same machine")
    parser.add_argument("--against", type=Path,
                        help="a second pair of daemons from this checkout's src/, measured in the same "
                             "rounds (each path's rounds of both interleaved): a before/after in one run")
    parser.add_argument("--profile", type=Path,
                        help="a directory for py-spy folded stacks, one file per path and round")
    parser.add_argument("--json", type=Path, help="where to write the results")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    tokens = args.tokens or (64 if args.quick else TOKENS)
    paths = [p for p in args.paths.split(",") if p]
    if any(p not in PATHS for p in paths) or not paths or rounds < 1 or args.conc < 1 or tokens < 1:
        parser.error("bad --paths, --rounds, --conc or --tokens")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    today = datetime.date.today().isoformat()
    out_path = args.json or REPO / "bench" / f"results-relay-cost-{today}{'-quick' * args.quick}.json"
    doc: dict[str, Any] = {"date": today, "commit": commit(), "cpus": os.cpu_count(), "rounds": rounds,
                           "conc": args.conc, "tokens": tokens, "token_delay_s": args.token_delay,
                           "paths": paths, "src": str(args.src or REPO / "src"),
                           "against": str(args.against) if args.against else None, "targets_us": TARGETS_US,
                           "load_average_before": os.getloadavg()}
    failed = False
    with tempfile.TemporaryDirectory(prefix="llmman-bench-relay-") as name, contextlib.ExitStack() as stack:
        try:
            sides = [prepared("this", stack.enter_context(daemons(Path(name) / "this", args.conc,
                                                                  args.token_delay, args.src)))]
            if args.against is not None:
                sides.append(prepared("against", stack.enter_context(daemons(
                    Path(name) / "against", args.conc, args.token_delay, args.against,
                    hosts=("127.0.0.4", "127.0.0.5")))))
            chains = ", ".join(f"{s.label}: {s.ds['a'].url} -> {s.ds['b'].url} -> {s.direct}" for s in sides)
            print(f"{chains}; {args.conc} streams of {tokens} tokens, fake delay "
                  f"{args.token_delay:g} s; a warm-up and {rounds} round(s) per path; {os.cpu_count()} CPUs",
                  flush=True)
            cells = asyncio.run(measure(sides, paths, args.conc, rounds, tokens, args.profile))
            if "hop" in paths and any(side.ds["a"].children() for side in sides):
                raise BenchError("a started a llama-server of its own: the requests did not hop")
            summaries = [c.summary() for c in cells]
            print()
            print_table(summaries)
            doc["summary"] = summaries
            doc["rounds_detail"] = [{"path": c.path, "side": c.side,
                                     "warmup": detail(c.warmup) if c.warmup else None,
                                     "rounds": [detail(r) for r in c.rounds]} for c in cells]
            errors = sum(s["errors"] + s["errors_warmup"] for s in summaries)
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
