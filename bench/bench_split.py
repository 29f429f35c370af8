"""Benchmark: a model split over ``ggml-rpc-server`` workers against the same model alone, on one machine.

Usage: ``.venv/bin/python bench/bench_split.py [--rounds N] [--tokens T] [--json OUT]``
(``make bench-split``).
The model is Gemma 3 270M (``LLMMAN_TEST_GEMMA`` or ``~/.cache/llmman/models/gemma-3-270m-q4_k_m.gguf``,
18 blocks), with the llama-server and ``ggml-rpc-server`` llmman would use (llmman.runner.binary).

Each round, in an order that rotates from round to round, these loads of the same model:

- ``alone``: ``llama-server -m gemma -ngl 99``: everything in this process. Load time and tokens/s.
- ``split``: two workers started as llmman starts them (llmman.runner.rpc_worker.rpc_argv, without ``-c``)
  and ``llama-server --rpc W1,W2 -ot KEEP_LOCAL -ngl 12 --tensor-split 1,1``: a 1:1:1 split over three
  nodes (6 blocks on this process's CPU with the embedding and output head, kept there by llmman's ``-ot``,
  llmman.runner.argv.KEEP_LOCAL; 6 blocks on each worker). Load time and tokens/s.
- ``cache_cold`` / ``cache_warm``: the same split with ``-c``, first over empty ``LLAMA_CACHE`` dirs (every
  tensor sent and, when cached, written), then on new workers over the caches the cold load filled. Load
  time only. llama.cpp's RPC client offers a tensor's hash instead of its bytes only for tensors over 10 MiB
  (``ggml-rpc.cpp``, ``HASH_THRESHOLD``), so the cache dirs' size is reported too.
- ``head_cold`` / ``head_warm``: the same pair without ``-ot``: Gemma's tied output head (the 262144 x 640
  embedding, ~170 MiB) then goes to the last worker, a tensor of the size a large model's layers have, so
  this pair shows what the cache does for tensors it does keep. Load time only.

Load time is from the spawn of llama-server to its first ``/health`` 200 (workers already listening, as a
lent worker is before the split starts). Tokens/s is llama-server's own ``timings.predicted_per_second`` for
``--tokens`` tokens at temperature 0 (and ``prompt_per_second`` for the prompt), the median of two requests.

**On one machine this measures the RPC protocol's overhead, not a speed-up**: the three "nodes" share the
same cores and memory, and every token crosses two loopback hops per device boundary. A split exists to run
a model that fits no single node; across real machines the network (bandwidth for the load, latency for each
token) is added on top. Figures are only reported, never asserted; medians and ratios are printed and written
to ``bench/results-split-<date>.json`` (or ``--json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from llmman.runner.argv import KEEP_LOCAL  # noqa: E402
from llmman.runner.binary import find_llama_server, find_rpc_server  # noqa: E402
from llmman.runner.rpc_worker import endpoint, rpc_argv, rpc_env  # noqa: E402

DEFAULT_GEMMA = Path.home() / ".cache/llmman/models/gemma-3-270m-q4_k_m.gguf"
BLOCKS = 18  # gemma3.block_count of Gemma 3 270M
CONFIGS = ("alone", "split", "cache_cold", "cache_warm", "head_cold", "head_warm")
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
NOTE = ("one machine: the split's three 'nodes' share these cores and memory, so this measures the RPC "
        "protocol's overhead (loopback hops per device boundary, tensors sent at load), not a speed-up; "
        "a split is for a model that fits no single node, and real networks add their bandwidth and latency")


class BenchError(RuntimeError):
    """Something failed (a process exited, an answer was not 200)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, log: Path, within: float = 30.0) -> None:
    """Until ``port`` accepts (the readiness llmman uses for a worker)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise BenchError(f"{what} exited with {proc.returncode}:\n{tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.01)  # polling a subprocess's port: the event is the port accepting
    raise BenchError(f"{what} did not listen within {within:g} s")


@contextmanager
def workers(binary: str, count: int, *, cache: bool, cache_dirs: list[Path], logs: Path,
            threads: int) -> Iterator[list[str]]:
    """``count`` ggml-rpc-server processes started with llmman's argv and environment; their endpoints."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        endpoints = []
        for i in range(count):
            port = free_port()
            env = rpc_env({"PATH": os.environ.get("PATH", "")}, cache_dirs[i])
            log = logs / f"rpc-{i}-{time.monotonic_ns()}.log"
            with log.open("wb") as out:
                argv = rpc_argv(binary, host="127.0.0.1", port=port, threads=threads, cache=cache)
                proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
            procs.append(proc)
            wait_port(port, proc, "ggml-rpc-server", log)
            endpoints.append(endpoint("127.0.0.1", port))
        yield endpoints
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def llama_load(llama: str, model: Path, extra: list[str], logs: Path, threads: int
               ) -> tuple[subprocess.Popen[bytes], int, float, Path]:
    """Start llama-server; returns it, its port, the seconds until ``/health`` answered 200, its log."""
    port = free_port()
    log = logs / f"llama-{time.monotonic_ns()}.log"
    argv = [llama, "-m", str(model), "-c", "1024", "-np", "1", "-t", str(threads), "--host", "127.0.0.1",
            "--port", str(port), "--no-warmup", "--log-verbosity", "4", *extra]
    with log.open("wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BenchError(f"llama-server exited with {proc.returncode}:\n"
                                 f"{log.read_text(errors='replace')[-3000:]}")
            try:
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return proc, port, time.perf_counter() - start, log
            except httpx.TransportError:
                pass
            time.sleep(0.01)  # polling a subprocess's readiness: the event is /health answering 200
    proc.kill()
    raise BenchError("llama-server did not load within 300 s")


def speed(port: int, tokens: int) -> tuple[float, float]:
    """Median (predicted tokens/s, prompt tokens/s) of two generations, llama-server's own timings."""
    gen, pp = [], []
    with httpx.Client(timeout=600) as client:
        for _ in range(2):
            r = client.post(f"http://127.0.0.1:{port}/completion",
                            json={"prompt": PROMPT, "n_predict": tokens, "temperature": 0, "ignore_eos": True,
                                  "cache_prompt": False})
            if r.status_code != 200:
                raise BenchError(f"/completion answered {r.status_code}: {r.text[:300]}")
            timings = r.json()["timings"]
            gen.append(float(timings["predicted_per_second"]))
            pp.append(float(timings["prompt_per_second"]))
    return statistics.median(gen), statistics.median(pp)


BREAKDOWN = re.compile(r"- (RPC\d+|Host) .*?\|\s*(?:\d+ = \d+ \+ \()?\s*\d+ =\s*(\d+) \+")


def model_mib(log: Path) -> dict[str, int]:
    """MiB of weights per device from llama-server's memory breakdown at exit (``RPC0``, ``RPC1``, ``Host``):
    the proof the weights went to the workers, and how the split fell."""
    out: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        found = BREAKDOWN.search(line) if "memory_breakdown" in line else None
        if found:
            out[found.group(1)] = int(found.group(2))
    return out


def one(config: str, *, llama: str, rpc: str, model: Path, tokens: int, work: Path, threads: int,
        ) -> dict[str, Any]:
    """Load ``config`` once; its load time, and its speed for ``alone`` and ``split``."""
    logs = work / "logs"
    if config == "alone":
        proc, port, load, log = llama_load(llama, model, ["-ngl", "99"], logs, threads)
        try:
            gen, pp = speed(port, tokens)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        return {"load_s": load, "tokens_per_s": gen, "prompt_per_s": pp}
    cache = config != "split"
    kind = config.split("_")[0]
    dirs = [work / "cache" / kind / str(i) for i in range(2)]
    if config.endswith("_cold") or not cache:
        for d in dirs:  # empty LLAMA_CACHE dirs (a cold load fills them for the warm one after it)
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
    with workers(rpc, 2, cache=cache, cache_dirs=dirs, logs=logs, threads=threads) as endpoints:
        keep = [] if kind == "head" else ["-ot", KEEP_LOCAL]
        extra = ["--rpc", ",".join(endpoints), *keep, "-ngl", str(2 * BLOCKS // 3), "--tensor-split", "1,1"]
        proc, port, load, log = llama_load(llama, model, extra, logs, threads)
        try:
            gen, pp = speed(port, tokens) if config == "split" else (0.0, 0.0)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    mib = model_mib(log)  # written as it exits
    if not mib.get("RPC0") or not mib.get("RPC1"):
        raise BenchError(f"{config}: no buffer on the RPC devices; llama-server said:\n"
                         f"{log.read_text(errors='replace')[-3000:]}")
    row: dict[str, Any] = {"load_s": load, "model_mib": mib,
                           "cache_bytes": sum(f.stat().st_size for d in dirs for f in (d / "rpc").glob("*")
                                              if f.is_file())}
    if config == "split":
        row.update(tokens_per_s=gen, prompt_per_s=pp)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model = Path(os.environ.get("LLMMAN_TEST_GEMMA") or DEFAULT_GEMMA)
    if not model.is_file():
        print(f"missing {model}: run scripts/setup.sh --test", file=sys.stderr)
        return 1
    llama = find_llama_server("", path_env=os.environ.get("PATH", ""))
    rpc = find_rpc_server(llama)
    threads = os.cpu_count() or 1
    print(f"model {model.name}, llama-server {llama}, {threads} CPUs, {args.rounds} round(s), "
          f"{args.tokens} tokens\nNOTE: {NOTE}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="llmman-bench-split-") as tmp:
        work = Path(tmp)
        (work / "logs").mkdir()
        for r in range(args.rounds):
            # rotate the order; a warm load always follows its cold one (it reads what that one wrote)
            order = [("alone",), ("split",), ("cache_cold", "cache_warm"), ("head_cold", "head_warm")]
            order = order[r % len(order):] + order[:r % len(order)]
            for config in (c for group in order for c in group):
                row = one(config, llama=llama, rpc=rpc, model=model, tokens=args.tokens, work=work,
                          threads=threads)
                row.update(round=r, config=config)
                rows.append(row)
                speeds = (f"  {row['tokens_per_s']:6.1f} tok/s  prompt {row['prompt_per_s']:6.1f} tok/s"
                          if "tokens_per_s" in row else "")
                weights = f"  weights MiB {row['model_mib']}" if "model_mib" in row else ""
                cached = f"  cache {row['cache_bytes'] / 2**20:.0f} MiB" if "cache_bytes" in row else ""
                print(f"round {r} {config:10s} load {row['load_s']:6.3f} s{speeds}{weights}{cached}",
                      flush=True)
    med: dict[str, dict[str, float]] = {}
    for c in CONFIGS:
        mine = [row for row in rows if row["config"] == c]
        keys = ("load_s", "tokens_per_s", "prompt_per_s", "cache_bytes")
        med[c] = {k: statistics.median(row[k] for row in mine) for k in keys if k in mine[0]}
    ratios = {
        "split_load_over_alone": med["split"]["load_s"] / med["alone"]["load_s"],
        "split_tokens_per_s_over_alone": med["split"]["tokens_per_s"] / med["alone"]["tokens_per_s"],
        "split_prompt_per_s_over_alone": med["split"]["prompt_per_s"] / med["alone"]["prompt_per_s"],
        "cache_cold_load_over_split": med["cache_cold"]["load_s"] / med["split"]["load_s"],
        "cache_warm_load_over_cold": med["cache_warm"]["load_s"] / med["cache_cold"]["load_s"],
        "head_warm_load_over_cold": med["head_warm"]["load_s"] / med["head_cold"]["load_s"],
    }
    print("\nmedians:")
    for c in CONFIGS:
        print(f"  {c:10s} " + "  ".join(f"{k} {v:.3f}" for k, v in med[c].items()))
    print("ratios:")
    for k, v in ratios.items():
        print(f"  {k:32s} {v:6.3f}")
    print(f"NOTE: {NOTE}")
    today = datetime.date.today().isoformat()
    out = args.json or REPO / "bench" / f"results-split-{today}.json"
    doc = {"date": today, "commit": _commit(), "cpus": threads, "model": model.name, "rounds": args.rounds,
           "tokens": args.tokens,
           "split": f"-ot {KEEP_LOCAL} -ngl {2 * BLOCKS // 3} --tensor-split 1,1 over 2 workers (1:1:1)",
           "note": NOTE, "medians": med, "ratios": ratios, "runs": rows}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench_split: {exc}", file=sys.stderr)
        sys.exit(1)
