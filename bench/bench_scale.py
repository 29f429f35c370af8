"""Benchmark: how far does the leaderless pool go? 8, 16 and 32 daemons on a simulated LAN (issue 15, item 6).

Usage (root): ``.venv/bin/python bench/bench_scale.py [--nodes 8,16,32] [--samples 40] [--json OUT]
[--quick]`` (``make bench-scale``). See docs/scaling.md for the results and what they mean; this docstring
is the method.

**The LAN** (``bench/scale_net.py``): every node is a network namespace ``llms-NAME`` with one veth link to
a bridge in a namespace of its own, its address in ``10.213.0.0/24`` (inside the namespaces only). Each node
runs ``llmman serve`` on its loopback behind ``bench/scale_delay.py``, a relay on the node's LAN address
that delays every chunk by ``--delay-ms`` (1 ms) each way: the round trip between two nodes is then 2 ms, as
``tc netem delay 1ms`` on every link would give (this kernel has no ``sch_netem``: see scale_net.py). Loss
(``--loss``, 0.1 %) is real: a BPF classifier drops that fraction of the packets leaving every link, so TCP
retransmits as it would on a lossy LAN. The benchmark's own client is one more namespace (``llms-client``);
its requests cross the LAN too. Everything is removed at the end, on Ctrl-C and on failure.

**The pool.** N nodes ``n0 .. n{N-1}``, each naming all the others in ``LLMMAN_PEERS`` with the default
``aggregation.refresh`` (1 s); node ``nK`` stores one model ``mK`` of its own (a tiny synthetic GGUF),
loaded there at the start (the fake llama-server, ``tests/fakes/fake_llama_server.py``, answering at once),
so a model lives on exactly one node. One more daemon, ``front`` (stored nothing), names the N nodes as
peers with ``aggregation.refresh`` 0 and is named by none: each of its decisions makes a probe round, as any
node does when its background views are stale (a node just started, peers unseen for 3 intervals).

**(1) Cold placement.** One sample, for a random K in 1..N-1: the time to the first byte of a streamed
``/api/generate`` for ``mK`` (a) sent to ``nK`` itself with ``x-llmman-hop`` (served there: ``direct``), (b)
sent to ``n0`` (fresh background views: ``fresh``), (c) sent to ``front`` (a probe round: ``stale``). Every
prompt is new, so no conversation affinity helps: each front decides from its views every time. The
**placement cost** is (b) or (c) minus (a) of the same sample: the decision plus the extra hop (one LAN
round trip, 2 ms, and the relay of the answer through the front node). The answer's ``x-llmman-node`` is
checked: a sample served elsewhere counts as misplaced. ``--samples`` per N after 5 warm-up ones, at rest,
under load and with loss on every link.

**(2) Background traffic.** Over ``--window`` seconds at rest, then under load (``--workers`` clients
sending requests for random models to random nodes back to back): per node per second, the probes it
answered (``GET /llmman/node``, counted by its relay, and their bytes both ways), everything its link
carried (its ``eth0`` bytes and packets from ``/proc/PID/net/dev``), and the daemon's CPU (user + system, %
of one core). RSS of every daemon, fake and relay is read too.

**(3) One bad node.** The last node is made bad, and for ``--fault-seconds`` from that moment samples (b)
and (c) run for models on the other nodes (the cost to the others): ``slow`` (its relay's delay raised so
its round trip is ``--slow-ms``), ``stopped`` (SIGSTOP: its kernel still accepts, nothing answers),
``link-down`` (its link set down: nothing answers, not even a refusal), and ``killed`` (SIGKILL of its
daemon and relay: refused at once). Between two faults the node is restored and the benchmark waits until
both fronts see it up again.

Timings are reported, never asserted; the exit status is non-zero only when the set-up failed. The machine's
load average is recorded with every N (the CPUs are shared: see docs/scaling.md for how to read that).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pool import commit, percentile
from bench_proxy import REPO, BenchError
from scale_net import Lan, NetError, link_counters
from tests.fakes.fake_llama_server import make_launcher
from tests.fakes.inprocess import make_store

DAEMON_PORT = 17435  # on each namespace's loopback
LAN_PORT = 17434  # the relay, on the node's LAN address
HOP = {"x-llmman-hop": "1"}
FAULTS = ("slow", "stopped", "link-down", "killed")
TARGET_MS = 50.0
LOCAL_COUNTERS = ("link_bytes", "link_packets", "cpu", "relay_cpu")  # read at the snapshot itself
_prompts = itertools.count(1)


@dataclass
class Node:
    """One daemon in its namespace, behind its relay."""

    name: str
    address: str
    root: Path
    daemon: subprocess.Popen[bytes]
    relay: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        """Where the others reach it: its relay."""
        return f"http://{self.address}:{LAN_PORT}"

    @property
    def stats(self) -> Path:
        """The relay's counters file."""
        return self.root / "relay.json"

    @property
    def log(self) -> Path:
        """The daemon's log."""
        return self.root / "daemon.log"


def in_ns(lan: Lan, name: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside node ``name``'s namespace (``ip netns exec`` execs it: the pid is the program's
    own)."""
    return ["ip", "netns", "exec", lan.ns(name), *argv]


def start_node(lan: Lan, name: str, root: Path, peers: Sequence[str], models: Sequence[str], *,
               delay_ms: float, slow_ms: float, extra: dict[str, str], src: Path | None) -> Node:
    """Start node ``name``'s daemon and relay (not waiting for them); the daemon runs the llmman package in
    ``src`` when given (a snapshot of a commit), else the installed one."""
    root.mkdir(parents=True)
    if models:
        make_store(root, models)
    home = root / "home"
    home.mkdir()
    bindir = root / "bin"
    bindir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_", "FAKE_"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_DATA_HOME=str(home / ".local/share"), LLMMAN_HOST=f"127.0.0.1:{DAEMON_PORT}",
               LLMMAN_MODELS=str(root / "store"), LLMMAN_OFFLINE="1",
               LLMMAN_LLAMA_SERVER=str(make_launcher(bindir)), LLMMAN_NUM_PARALLEL="4",
               LLMMAN_KEEP_ALIVE="-1", LLMMAN_NODE_NAME=name,
               LLMMAN_PEERS=",".join(f"{p}:{LAN_PORT}" for p in peers),
               FAKE_REPLY="ok then", PYTHONUNBUFFERED="1", **extra)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    address = lan.addresses[name]
    with (root / "daemon.log").open("ab") as out:
        daemon = subprocess.Popen(in_ns(lan, name, [sys.executable, "-m", "llmman", "serve"]), env=env,
                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=root)
    with (root / "relay.log").open("ab") as out:
        argv = [sys.executable, str(REPO / "bench" / "scale_delay.py"), address, str(LAN_PORT), "127.0.0.1",
                str(DAEMON_PORT), str(delay_ms), str(slow_ms), str(root / "relay.json")]
        relay = subprocess.Popen(in_ns(lan, name, argv), stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    return Node(name, address, root, daemon, relay)


def wait_for(what: str, condition: Any, timeout: float) -> None:
    """Poll ``condition()`` until true.

    Raises:
        BenchError: it did not hold within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)  # polling subprocesses' state; the condition is the event


def answers(node: Node) -> bool:
    """Whether ``node`` answers ``/api/version`` through its relay.

    Raises:
        BenchError: its daemon exited.
    """
    if node.daemon.poll() is not None:
        raise BenchError(f"{node.name} exited with {node.daemon.returncode}: {node.log.read_text()[-2000:]}")
    try:
        return httpx.get(node.url + "/api/version", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def sees(front: Node, peers: Sequence[Node], *, loaded: bool = False) -> bool:
    """Whether ``front``'s ``/llmman/pool`` shows every one of ``peers`` up (and, with ``loaded``, its model
    loaded there)."""
    try:
        nodes = httpx.get(front.url + "/llmman/pool", timeout=5).json()["nodes"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    by_address = {n["address"].rsplit(":", 1)[0]: n for n in nodes if not n["self"]}
    for peer in peers:
        n = by_address.get(peer.address)
        if n is None or n["state"] != "up" or n["last_seen"] is None or (loaded and not n["models"]):
            return False
    return True


# --------------------------------------------------------------------------------------------- requests
@dataclass
class Sample:
    """One request's time to its first body byte and who served it."""

    ms: float
    ok: bool
    node: str
    status: int
    error: str = ""


async def first_byte(session: aiohttp.ClientSession, url: str, model: str,
                     headers: dict[str, str] | None = None, limit: float = 30.0) -> Sample:
    """POST a streamed ``/api/generate`` for ``model`` (a new prompt, 2 tokens) and time its first body byte;
    the answer is read to its end."""
    body = orjson.dumps({"model": model, "prompt": f"question {next(_prompts)}", "stream": True,
                         "options": {"num_predict": 2}})
    t0 = time.perf_counter()
    try:
        async with session.post(url + "/api/generate", data=body, headers=headers or {},
                                timeout=aiohttp.ClientTimeout(total=limit)) as resp:
            chunk = await resp.content.readany()
            ms = (time.perf_counter() - t0) * 1000
            rest = chunk
            while more := await resp.content.readany():
                rest += more
            ok = resp.status == 200 and b'"error"' not in rest and b'"done":true' in rest
            return Sample(ms, ok, resp.headers.get("x-llmman-node", ""), resp.status,
                          "" if ok else rest[:200].decode(errors="replace"))
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return Sample((time.perf_counter() - t0) * 1000, False, "", 0, f"{type(exc).__name__}: {exc}")


@dataclass
class Placement:
    """Samples of one condition: per sample the direct time and each front's."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Medians, p95s and counts of every column, and of the paired costs (front minus direct)."""
        out: dict[str, Any] = {"samples": len(self.rows)}
        for col in ("direct", "fresh", "stale"):
            got = [r[col] for r in self.rows if col in r]
            if not got:
                continue
            good = [s["ms"] for s in got if s["ok"]]
            out[col] = {"p50_ms": percentile(good, 0.5), "p95_ms": percentile(good, 0.95),
                        "max_ms": max(good, default=0.0), "errors": sum(1 for s in got if not s["ok"]),
                        "misplaced": sum(1 for r in self.rows
                                         if col in r and r[col]["ok"] and r[col]["node"] != r["want"])}
            if col != "direct" and any("direct" in r for r in self.rows):
                cost = [r[col]["ms"] - r["direct"]["ms"] for r in self.rows
                        if col in r and "direct" in r and r[col]["ok"] and r["direct"]["ok"]]
                out[col]["cost_p50_ms"] = percentile(cost, 0.5)
                out[col]["cost_p95_ms"] = percentile(cost, 0.95)
        return out


def sample_doc(s: Sample) -> dict[str, Any]:
    """A sample for the JSON."""
    return {"ms": round(s.ms, 3), "ok": s.ok, "node": s.node, "status": s.status, **({"error": s.error}
                                                                                     if s.error else {})}


async def place(session: aiohttp.ClientSession, nodes: Sequence[Node], front: Node, k: int, *,
                direct: bool = True, stale: bool = True) -> dict[str, Any]:
    """One placement sample for node ``k``'s model: direct (optional), through n0, through the probing
    front."""
    model, row = f"m{k}", {"want": nodes[k].name, "k": k}
    if direct:
        row["direct"] = sample_doc(await first_byte(session, nodes[k].url, model, HOP))
    row["fresh"] = sample_doc(await first_byte(session, nodes[0].url, model))
    if stale:
        row["stale"] = sample_doc(await first_byte(session, front.url, model))
    return row


async def placements(session: aiohttp.ClientSession, nodes: Sequence[Node], front: Node, count: int,
                     rng: random.Random, *, warmup: int = 5) -> Placement:
    """``count`` samples (after ``warmup`` thrown away), K drawn from 1..N-1."""
    out = Placement()
    for i in range(warmup + count):
        row = await place(session, nodes, front, rng.randrange(1, len(nodes)))
        if i >= warmup:
            out.rows.append(row)
    return out


async def load(session: aiohttp.ClientSession, nodes: Sequence[Node], workers: int, stop: asyncio.Event,
               rng: random.Random) -> dict[str, int]:
    """``workers`` clients, each sending requests for a random model to a random node until ``stop``."""
    counts = {"requests": 0, "errors": 0}

    async def worker() -> None:
        while not stop.is_set():
            node, k = rng.choice(nodes), rng.randrange(len(nodes))
            s = await first_byte(session, node.url, f"m{k}")
            counts["requests"] += 1
            counts["errors"] += 0 if s.ok else 1

    await asyncio.gather(*(worker() for _ in range(workers)))
    return counts


# ---------------------------------------------------------------------------------------------- traffic
def snapshot(nodes: Sequence[Node]) -> dict[str, dict[str, float]]:
    """Per node: its relay's counters, its link's counters and its daemon's CPU seconds, now."""
    out: dict[str, dict[str, float]] = {}
    for node in nodes:
        relay = json.loads(node.stats.read_text())
        rx, rxp, tx, txp = link_counters(node.daemon.pid)
        cpu = psutil.Process(node.daemon.pid).cpu_times()
        rcpu = psutil.Process(node.relay.pid).cpu_times()
        out[node.name] = {**{k: float(v) for k, v in relay.items() if k != "other_lines"},
                          "link_bytes": rx + tx,
                          "link_packets": rxp + txp, "cpu": cpu.user + cpu.system,
                          "relay_cpu": rcpu.user + rcpu.system, "clock": time.monotonic()}
    return out


def rates(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per node per second over the window, averaged over the nodes (and the largest node's)."""
    keys = ("probe_requests", "probe_bytes_in", "probe_bytes_out", "other_requests", "other_bytes_in",
            "other_bytes_out", "link_bytes", "link_packets", "cpu", "relay_cpu")
    per: dict[str, dict[str, float]] = {}
    for name, a in after.items():
        b = before[name]
        seconds, written = a["clock"] - b["clock"], a["t"] - b["t"]  # the relay's counters: as of "t"
        per[name] = {k: (a.get(k, 0.0) - b.get(k, 0.0)) / (seconds if k in LOCAL_COUNTERS else written)
                     for k in keys}
    mean = {k: statistics.fmean(p[k] for p in per.values()) for k in keys}
    top = {k: max(p[k] for p in per.values()) for k in keys}
    return {"mean": mean, "max": top, "nodes": len(per),
            "per_node": {n: {k: round(v, 3) for k, v in p.items()} for n, p in per.items()}}


def other_lines(nodes: Sequence[Node]) -> dict[str, int]:
    """The requests other than probes that the nodes' relays have passed so far, by request line."""
    out: dict[str, int] = {}
    for node in nodes:
        for line, n in json.loads(node.stats.read_text()).get("other_lines", {}).items():
            out[line] = out.get(line, 0) + n
    return dict(sorted(out.items(), key=lambda item: -item[1]))


def memory(nodes: Sequence[Node]) -> dict[str, float]:
    """RSS in MB: every daemon, its fake children, every relay (means per node and the total)."""
    daemons, fakes, relays = [], [], []
    for node in nodes:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(node.daemon.pid)
            daemons.append(proc.memory_info().rss)
            fakes += [c.memory_info().rss for c in proc.children(recursive=True)]
            relays.append(psutil.Process(node.relay.pid).memory_info().rss)
    mb = 1024 * 1024
    return {"daemon_mb": statistics.fmean(daemons) / mb if daemons else 0.0,
            "fake_mb": statistics.fmean(fakes) / mb if fakes else 0.0,
            "relay_mb": statistics.fmean(relays) / mb if relays else 0.0,
            "total_mb": (sum(daemons) + sum(fakes) + sum(relays)) / mb}


async def traffic(session: aiohttp.ClientSession, nodes: Sequence[Node], front: Node, window: float,
                  workers: int, rng: random.Random) -> dict[str, Any]:
    """The traffic window at rest, then under load (with placement samples taken meanwhile)."""
    await asyncio.sleep(1.0)  # the relays' counter files (written every 0.5 s) catch up with what came before
    before = snapshot(nodes)
    await asyncio.sleep(window)  # the measuring window itself
    rest = rates(before, snapshot(nodes))
    stop = asyncio.Event()
    loader = asyncio.ensure_future(load(session, nodes, workers, stop, rng))
    await asyncio.sleep(1.0)  # the load gets going before the window opens
    before = snapshot(nodes)
    t_end = time.monotonic() + window
    under = Placement()
    while time.monotonic() < t_end:
        # no probing front here: its probe rounds would count as the pool's background traffic
        under.rows.append(await place(session, nodes, front, rng.randrange(1, len(nodes)), stale=False))
    loaded = rates(before, snapshot(nodes))
    stop.set()
    counts = await loader
    return {"rest": rest, "load": {**loaded, "load_requests": counts}, "placement_under_load": under}


# ----------------------------------------------------------------------------------------------- faults
def undo(lan: Lan, victim: Node, fault: str) -> None:
    """Make ``victim`` good again after ``fault`` (not after ``killed``)."""
    if fault == "slow":
        victim.relay.send_signal(signal.SIGUSR2)
    elif fault == "stopped":
        victim.daemon.send_signal(signal.SIGCONT)
    elif fault == "link-down":
        lan.link(victim.name, True)


def apply(lan: Lan, victim: Node, fault: str) -> None:
    """Make ``victim`` bad in the way ``fault`` names."""
    if fault == "slow":
        victim.relay.send_signal(signal.SIGUSR1)
    elif fault == "stopped":
        victim.daemon.send_signal(signal.SIGSTOP)
    elif fault == "link-down":
        lan.link(victim.name, False)
    elif fault == "killed":
        for proc in (victim.daemon, victim.relay):
            proc.kill()
            proc.wait()


async def fault_run(session: aiohttp.ClientSession, lan: Lan, nodes: Sequence[Node], front: Node, fault: str,
                    seconds: float, rng: random.Random) -> dict[str, Any]:
    """Samples through both fronts for models of the good nodes, for ``seconds`` from the fault on."""
    victim = nodes[-1]
    apply(lan, victim, fault)
    t0 = time.monotonic()
    rows = Placement()
    while time.monotonic() - t0 < seconds:
        row = await place(session, nodes, front, rng.randrange(1, len(nodes) - 1), direct=False)
        row["at_s"] = round(time.monotonic() - t0, 3)
        rows.rows.append(row)
    early = Placement([r for r in rows.rows if r["at_s"] < 4.0])
    late = Placement([r for r in rows.rows if r["at_s"] >= 4.0])
    out = {"fault": fault, **rows.summary(), "first_4s": early.summary(), "after_4s": late.summary(),
           "rows": rows.rows}
    if fault != "killed":
        undo(lan, victim, fault)
        await asyncio.to_thread(wait_for, f"both fronts to see {victim.name} again",
                                lambda: sees(nodes[0], nodes[1:]) and sees(front, nodes), 60.0)
    return out


# -------------------------------------------------------------------------------------------------- run
def probe_rounds(node: Node, since: int) -> tuple[int, int]:
    """``(probe rounds logged in node's log after byte offset since, the log's size now)``."""
    data = node.log.read_bytes()
    return data[since:].count(b"probe round"), len(data)


async def measure(lan: Lan, nodes: Sequence[Node], front: Node, args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of one N."""
    rng = random.Random(len(nodes))
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        _, offset = probe_rounds(nodes[0], 0)
        rest = await placements(session, nodes, front, args.samples, rng)
        rounds, offset = probe_rounds(nodes[0], offset)
        out["placement_rest"] = {**rest.summary(), "n0_probe_rounds": rounds, "rows": rest.rows}
        print_placement(len(nodes), "at rest", out["placement_rest"])
        seen = await traffic(session, nodes, front, args.window, args.workers, rng)
        under = seen.pop("placement_under_load")
        rounds, offset = probe_rounds(nodes[0], offset)
        out["placement_load"] = {**under.summary(), "n0_probe_rounds": rounds, "rows": under.rows}
        out["traffic"] = seen
        out["memory"] = memory([*nodes, front])
        out["other_lines"] = other_lines(nodes)
        print_placement(len(nodes), "under load", out["placement_load"])
        print_traffic(len(nodes), seen, out["memory"])
        if args.loss > 0:
            for name in lan.names:
                lan.set_loss(name, args.loss / 100)
            lossy = await placements(session, nodes, front, args.samples, rng, warmup=0)
            for name in lan.names:
                lan.set_loss(name, 0)
            rounds, offset = probe_rounds(nodes[0], offset)
            out["placement_loss"] = {**lossy.summary(), "loss_percent": args.loss, "n0_probe_rounds": rounds,
                                     "dropped_packets": sum(lan.dropped(n) for n in lan.names),
                                     "rows": lossy.rows}
            print_placement(len(nodes), f"loss {args.loss:g} %", out["placement_loss"])
        out["faults"] = []
        for fault in args.faults:
            run = await fault_run(session, lan, nodes, front, fault, args.fault_seconds, rng)
            out["faults"].append(run)
            print_fault(len(nodes), run)
    return out


def one_n(count: int, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start N nodes and the probing front on a fresh LAN, measure, tear everything down."""
    names = [f"n{i}" for i in range(count)]
    with Lan([*names, "front", "client"]) as lan:
        lan.enter("client")
        t0 = time.monotonic()
        nodes = []
        for i, name in enumerate(names):
            peers = [lan.addresses[n] for n in names if n != name]
            extra = {"LLMMAN_DEBUG": "1"} if i == 0 else {}
            if args.refresh is not None:  # aggregation.refresh, raised with N to keep each node's rate
                extra["LLMMAN_PEER_REFRESH"] = args.refresh
            nodes.append(start_node(lan, name, tmp / name, peers, [f"m{i}"], delay_ms=args.delay_ms,
                                    slow_ms=args.slow_ms / 2, extra=extra, src=args.src))
        front = start_node(lan, "front", tmp / "front", [lan.addresses[n] for n in names], [],
                           delay_ms=args.delay_ms, slow_ms=args.slow_ms / 2,
                           extra={"LLMMAN_PEER_REFRESH": "0"}, src=args.src)
        for node in [*nodes, front]:
            wait_for(f"{node.name} to answer", lambda node=node: answers(node), 180.0)
        started = time.monotonic() - t0

        async def preload() -> None:
            async with aiohttp.ClientSession() as session:
                async def one(i: int) -> None:
                    body = orjson.dumps({"model": f"m{i}", "keep_alive": -1})
                    async with session.post(nodes[i].url + "/api/generate", data=body, headers=HOP,
                                            timeout=aiohttp.ClientTimeout(total=120)) as resp:
                        if resp.status != 200:
                            raise BenchError(f"loading m{i} on n{i}: {resp.status} {await resp.text()}")
                await asyncio.gather(*(one(i) for i in range(count)))

        asyncio.run(preload())
        wait_for("every node to see every other up", lambda: all(sees(n, [m for m in nodes if m is not n])
                                                                for n in nodes), 180.0)
        wait_for("n0 to see every model loaded", lambda: sees(nodes[0], nodes[1:], loaded=True), 60.0)
        ready = time.monotonic() - t0
        print(f"N={count}: {count} daemons + front up in {started:.1f} s, pool ready in {ready:.1f} s; "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)
        doc: dict[str, Any] = {"nodes": count, "refresh": args.refresh or "1s", "start_s": started,
                               "ready_s": ready,
                               "load_average_before": os.getloadavg()}
        doc.update(asyncio.run(measure(lan, nodes, front, args)))
        doc["load_average_after"] = os.getloadavg()
        doc["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    return doc


# ------------------------------------------------------------------------------------------------ print
def fmt(cell: dict[str, Any] | None, key: str) -> str:
    """One figure of a placement column, or a dash."""
    return "-" if not cell or key not in cell else f"{cell[key]:.1f}"


def print_placement(n: int, what: str, s: dict[str, Any]) -> None:
    """One placement condition's line."""
    for col in ("fresh", "stale"):
        c = s.get(col)
        if c is None:
            continue
        print(f"  N={n:<3} {what:<11} {col:<6} first byte p50 {fmt(c, 'p50_ms'):>7} "
              f"p95 {fmt(c, 'p95_ms'):>7} max {fmt(c, 'max_ms'):>7} ms | direct p50 "
              f"{fmt(s.get('direct'), 'p50_ms'):>6} | cost p50 "
              f"{fmt(c, 'cost_p50_ms'):>6} p95 {fmt(c, 'cost_p95_ms'):>7} ms | errors {c['errors']} "
              f"misplaced {c['misplaced']} | samples {s['samples']}", flush=True)


def print_traffic(n: int, t: dict[str, Any], mem: dict[str, float]) -> None:
    """The traffic lines of one N."""
    for phase in ("rest", "load"):
        m = t[phase]["mean"]
        print(f"  N={n:<3} traffic {phase:<5} per node/s: probes answered {m['probe_requests']:6.1f}, "
              f"probe bytes {(m['probe_bytes_in'] + m['probe_bytes_out']) / 1024:7.1f} KiB, link "
              f"{m['link_bytes'] / 1024:7.1f} KiB / {m['link_packets']:6.0f} packets, daemon CPU "
              f"{m['cpu'] * 100:5.1f} % (max {t[phase]['max']['cpu'] * 100:5.1f} %), relay CPU "
              f"{m['relay_cpu'] * 100:4.1f} %", flush=True)
    print(f"  N={n:<3} RSS per node: daemon {mem['daemon_mb']:.0f} MB, fake {mem['fake_mb']:.0f} MB, relay "
          f"{mem['relay_mb']:.0f} MB; total {mem['total_mb'] / 1024:.2f} GB", flush=True)


def print_fault(n: int, r: dict[str, Any]) -> None:
    """One fault's lines."""
    for col in ("fresh", "stale"):
        c, early, late = r.get(col), r["first_4s"].get(col), r["after_4s"].get(col)
        if c is None:
            continue
        print(f"  N={n:<3} {r['fault']:<10} {col:<6} p50 {fmt(c, 'p50_ms'):>7} p95 {fmt(c, 'p95_ms'):>7} max "
              f"{fmt(c, 'max_ms'):>7} ms | first 4 s p50 {fmt(early, 'p50_ms'):>7} "
              f"max {fmt(early, 'max_ms'):>7} | after p50 {fmt(late, 'p50_ms'):>7} "
              f"max {fmt(late, 'max_ms'):>7} | errors {c['errors']} "
              f"misplaced {c['misplaced']} | samples {r['samples']}", flush=True)


def pair(cell: dict[str, Any] | None, a: str, b: str) -> str:
    """``a/b`` of a placement column, one decimal each, or a dash."""
    return "-" if not cell or a not in cell else f"{cell[a]:.1f} / {cell[b]:.1f}"


def markdown(doc: dict[str, Any]) -> str:
    """The summary tables of docs/scaling.md, from a results document."""
    runs = [r for r in doc["runs"] if "failed" not in r]
    lines = ["| N | fresh: first byte | fresh: cost | stale: first byte | stale: cost | fresh, loss | "
             "stale, loss | fresh, under load | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        rest, loss, under = r["placement_rest"], r.get("placement_loss", {}), r["placement_load"]
        errors = sum(c.get(col, {}).get("errors", 0) + c.get(col, {}).get("misplaced", 0)
                     for c in (rest, loss, under) for col in ("fresh", "stale", "direct"))
        lines.append(f"| {r['nodes']} | {pair(rest.get('fresh'), 'p50_ms', 'p95_ms')} | "
                     f"{pair(rest.get('fresh'), 'cost_p50_ms', 'cost_p95_ms')} | "
                     f"{pair(rest.get('stale'), 'p50_ms', 'p95_ms')} | "
                     f"{pair(rest.get('stale'), 'cost_p50_ms', 'cost_p95_ms')} | "
                     f"{pair(loss.get('fresh'), 'p50_ms', 'p95_ms')} | "
                     f"{pair(loss.get('stale'), 'p50_ms', 'p95_ms')} | "
                     f"{pair(under.get('fresh'), 'p50_ms', 'p95_ms')} | {errors} |")
    lines += ["", "| N | probes answered /node/s (rest, load) | probe KiB /node/s | link KiB, packets "
              "/node/s (rest) | daemon CPU % of a core (rest, load) | RSS MB /node (daemon + fake + relay) "
              "| load average |",
              "|---|---|---|---|---|---|---|"]
    for r in runs:
        rest, load = r["traffic"]["rest"]["mean"], r["traffic"]["load"]["mean"]
        mem = r["memory"]
        lines.append(f"| {r['nodes']} | {rest['probe_requests']:.1f}, {load['probe_requests']:.1f} | "
                     f"{(rest['probe_bytes_in'] + rest['probe_bytes_out']) / 1024:.1f} | "
                     f"{rest['link_bytes'] / 1024:.1f}, {rest['link_packets']:.0f} | "
                     f"{rest['cpu'] * 100:.1f}, {load['cpu'] * 100:.1f} | "
                     f"{mem['daemon_mb']:.0f} + {mem['fake_mb']:.0f} + {mem['relay_mb']:.0f} | "
                     f"{r['load_average_before'][0]:.1f} → {r['load_average_after'][0]:.1f} |")
    lines += ["", "| N | bad node | fresh: p50 / max | stale: p50 / max | stale, first 4 s: max | errors |",
              "|---|---|---|---|---|---|"]
    for r in runs:
        for f in r["faults"]:
            errors = sum(f.get(col, {}).get("errors", 0) + f.get(col, {}).get("misplaced", 0)
                         for col in ("fresh", "stale"))
            early = f["first_4s"].get("stale", {})
            lines.append(f"| {r['nodes']} | {f['fault']} | {pair(f.get('fresh'), 'p50_ms', 'max_ms')} | "
                         f"{pair(f.get('stale'), 'p50_ms', 'max_ms')} | "
                         f"{early.get('max_ms', 0.0):.0f} | {errors} |")
    return "\n".join(lines)


def snapshot_head(where: Path) -> Path:
    """HEAD's ``src/`` exported into ``where``; the directory to put on the daemons' PYTHONPATH.

    Raises:
        BenchError: git failed.
    """
    where.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", "src"], capture_output=True,
                             check=False)
    if archive.returncode != 0:
        raise BenchError(f"git archive: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return where / "src"


def main() -> int:
    """Check the machine, run every N, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", default="8,16,32", help="the pool sizes (default 8,16,32)")
    parser.add_argument("--samples", type=int, help="placement samples per condition (40; --quick 15)")
    parser.add_argument("--window", type=float, help="seconds of each traffic window (10; --quick 5)")
    parser.add_argument("--workers", type=int, default=4, help="clients sending back to back under load")
    parser.add_argument("--delay-ms", type=float, default=1.0, help="one-way delay of every link (1 ms)")
    parser.add_argument("--loss", type=float, default=0.1, help="percent of packets lost per link (0.1)")
    parser.add_argument("--slow-ms", type=float, default=200.0, help="round trip of the slow node (200 ms)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"which faults ({','.join(FAULTS)})")
    parser.add_argument("--fault-seconds", type=float, help="seconds sampled after each fault (8; --quick 6)")
    parser.add_argument("--refresh", help="the nodes' aggregation.refresh (default 1s), e.g. 4s at 32")
    parser.add_argument("--quick", action="store_true", help="fewer samples and shorter windows")
    parser.add_argument("--json", type=Path, help="where to write the results")
    parser.add_argument("--workdir", type=Path, help="keep the daemons' homes, stores and logs here")
    parser.add_argument("--src", type=Path, help="run the daemons from this src/ directory (an A/B test)")
    parser.add_argument("--table", type=Path, help="print the tables of a results file and exit")
    parser.add_argument("--head", action="store_true",
                        help="run the daemons from a snapshot of HEAD's src/, not the working tree")
    args = parser.parse_args()
    if args.table:
        print(markdown(json.loads(args.table.read_text())))
        return 0
    args.samples = args.samples or (15 if args.quick else 40)
    args.window = args.window or (5.0 if args.quick else 10.0)
    args.fault_seconds = args.fault_seconds or (6.0 if args.quick else 8.0)
    args.faults = [f for f in args.faults.split(",") if f]
    if unknown := set(args.faults) - set(FAULTS):
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    counts = [int(n) for n in args.nodes.split(",")]
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        print("bench_scale needs root and iproute2 (ip, tc): it makes network namespaces", file=sys.stderr)
        return 2
    today = datetime.date.today().isoformat()
    out_path = args.json or REPO / "bench" / f"results-scale-{today}{'-quick' if args.quick else ''}.json"
    doc: dict[str, Any] = {
        "date": today, "commit": commit(), "cpus": os.cpu_count(),
        "memory_gb": psutil.virtual_memory().total / 2**30, "delay_ms": args.delay_ms,
        "rtt_ms": 2 * args.delay_ms, "loss_percent": args.loss, "slow_rtt_ms": args.slow_ms,
        "samples": args.samples, "window_s": args.window, "workers": args.workers,
        "fault_seconds": args.fault_seconds, "delay_method": "user-space relay (bench/scale_delay.py)",
        "loss_method": "cls_bpf random drop on each link (bench/scale_net.py)", "runs": []}

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    status = 0
    with tempfile.TemporaryDirectory(prefix="llmman-bench-scale-") as name:
        tmp = args.workdir or Path(name)
        if args.src is not None:
            args.src = args.src.resolve()
            doc["daemon_code"] = f"{args.src}"
        elif args.head:
            args.src = snapshot_head(tmp / "head")
            doc["daemon_code"] = "HEAD " + commit().rstrip("+")
        else:
            doc["daemon_code"] = "installed llmman (working tree " + commit() + ")"
        for count in counts:
            try:
                doc["runs"].append(one_n(count, tmp / f"n{count}", args))
            except (BenchError, NetError, OSError) as exc:
                print(f"N={count} failed: {exc}", file=sys.stderr)
                doc["runs"].append({"nodes": count, "failed": str(exc)})
                status = 1
            out_path.write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(doc))
    print(f"results: {out_path}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
