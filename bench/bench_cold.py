"""Benchmark: time to first token for a cold model through llmman vs llama-server on its own.

Usage: ``.venv/bin/python bench/bench_cold.py [--rounds N]``. Starts a private ``llmman serve`` with
SmolLM2-135M in its store (``LLMMAN_TEST_MODEL`` or
``~/.cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf``, ``LLMMAN_CONTEXT_LENGTH=2048``). Each round:

- llmman: the model is unloaded (``keep_alive: 0``), then a streaming ``/v1/chat/completions``
  (``max_tokens`` 1, temperature 0) is sent; time from sending to the first content chunk.
- direct: the very command line llmman used for its child (read from the child's ``/proc`` cmdline,
  another free port) is started by hand; time from spawn until ``/health`` answers 200 (polled every
  10 ms) plus the same request to its first content chunk.

Rounds alternate the order; medians are printed with llmman's overhead (target: under 100 ms, issue 4).
Timings are only reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from tests.integration.daemons import Daemon, start_daemon  # noqa: E402

from llmman.refs import parse_reference  # noqa: E402
from llmman.store import Store  # noqa: E402

MODEL = "smollm2:135m"
DEFAULT_MODEL_FILE = Path.home() / ".cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_MS = 100.0
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1,
        "temperature": 0, "stream": True}


def first_token(client: httpx.Client, url: str) -> float:
    """Seconds from sending BODY to ``url`` until the first SSE ``data:`` line with content."""
    start = time.perf_counter()
    with client.stream("POST", url, json=BODY) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return time.perf_counter() - start
    raise RuntimeError(f"no content from {url}")


def child_argv(daemon: Daemon) -> list[str]:
    for proc in psutil.Process(daemon.process.pid).children(recursive=True):
        argv = proc.cmdline()
        if any("llama-server" in a for a in argv[:2]):
            return argv
    raise RuntimeError("no llama-server child found")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def direct_round(client: httpx.Client, argv: list[str]) -> float:
    port = free_port()
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    base = f"http://127.0.0.1:{port}"
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                if client.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}")
            time.sleep(0.01)  # the poll interval is part of what is measured, as in llmman's own poll
        ready = time.perf_counter() - start
        return ready + first_token(client, base + "/v1/chat/completions")
    finally:
        proc.terminate()
        proc.wait(10)


def llmman_round(client: httpx.Client, daemon: Daemon) -> float:
    client.post(daemon.url + "/api/generate", json={"model": MODEL, "keep_alive": 0}).raise_for_status()
    while client.get(daemon.url + "/api/ps").json()["models"]:
        time.sleep(0.01)
    return first_token(client, daemon.url + "/v1/chat/completions")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model_file = Path(os.environ.get("LLMMAN_TEST_MODEL") or DEFAULT_MODEL_FILE)
    with tempfile.TemporaryDirectory() as tmp:
        Store(Path(tmp) / "store").build(parse_reference(MODEL), model_file)
        daemon = start_daemon(Path(tmp), extra_env={"LLMMAN_CONTEXT_LENGTH": "2048"})
        try:
            with httpx.Client(timeout=120) as client:
                first_token(client, daemon.url + "/v1/chat/completions")  # warm the page cache
                argv = child_argv(daemon)
                ours: list[float] = []
                direct: list[float] = []
                for i in range(args.rounds):
                    if i % 2:
                        direct.append(direct_round(client, argv))
                        ours.append(llmman_round(client, daemon))
                    else:
                        ours.append(llmman_round(client, daemon))
                        direct.append(direct_round(client, argv))
        finally:
            daemon.stop()
    o, d = statistics.median(ours) * 1000, statistics.median(direct) * 1000
    print(f"cold start to first token, median of {args.rounds} rounds ({model_file.name}):")
    print(f"  llama-server alone : {d:8.1f} ms   (each: {', '.join(f'{x * 1000:.0f}' for x in direct)})")
    print(f"  through llmman     : {o:8.1f} ms   (each: {', '.join(f'{x * 1000:.0f}' for x in ours)})")
    print(f"  llmman adds        : {o - d:8.1f} ms   (target < {TARGET_MS:.0f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
