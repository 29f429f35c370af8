"""Benchmark: what the operator's view costs per request, in process (llmman.obs, llmman.api.observed).

Usage: ``.venv/bin/python bench/bench_obs.py [--requests N] [--answers N] [--reps R]``. Two parts:

1. **The observed answer.** A streamed 64-token OpenAI answer (66 SSE chunks, usage and timings last, as
   llama-server sends them) is sent through a Starlette ``StreamingResponse`` to a no-op ASGI ``send``,
   bare and wrapped in :class:`llmman.api.observed.Observed` with metrics and the request log (a real
   SQLite file in a temporary folder) on, both off, metrics only and the log only. Reported: CPU
   microseconds of this process (every thread: the request log's writer included) per answer, the minimum
   over ``--reps`` interleaved repetitions of ``--answers`` answers each, and what each adds to the bare
   answer. This is the observation's whole cost per request, free of the network and of other load.
2. **The pieces.** :meth:`llmman.obs.observer.Observer.request_done` (the request log's non-blocking
   enqueue and the metric updates), each half alone, how long the writer thread takes to put the rows in
   SQLite, and one ``/metrics`` exposition.

Timings are only reported, never asserted. The relay's end-to-end figure at 1, 16 and 256 streams is
``bench/bench_relay_obs.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import timeit
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Message, Scope

from llmman.api.observed import Observed, Served
from llmman.obs.metrics import Metrics
from llmman.obs.observer import Observer
from llmman.obs.requestlog import RequestLog, RequestRow
from llmman.obs.stopwatch import Stopwatch

_BASE = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "tiny",
         "system_fingerprint": "b1"}
_TOKEN = {**_BASE, "choices": [{"index": 0, "finish_reason": None, "delta": {"content": ""}}]}
_LAST = {**_BASE, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 64, "total_tokens": 69},
         "timings": {"predicted_n": 64, "predicted_per_second": 100.0}}
CHUNKS = [b"data: " + json.dumps(_TOKEN).replace(b'""'.decode(), f'" w{i}"').encode() + b"\n\n"
          for i in range(64)]
CHUNKS += [b"data: " + json.dumps(_LAST).encode() + b"\n\n", b"data: [DONE]\n\n"]
SCOPE: Scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
                "query_string": b"", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 11434),
                "scheme": "http", "root_path": ""}


async def _receive() -> Message:
    return {"type": "http.disconnect"}


async def _send(message: Message) -> None:
    return None


async def _chunks() -> AsyncIterator[bytes]:
    for chunk in CHUNKS:
        yield chunk


def _answer() -> Response:
    return StreamingResponse(_chunks(), media_type="text/event-stream")


async def observed_answer(answers: int, reps: int, tmp: Path) -> None:
    """Part 1: CPU per answer, bare and observed four ways."""
    on_log = RequestLog(tmp / "on.db").start()
    log_only = RequestLog(tmp / "log.db").start()
    observers = {"on (metrics + log)": (Observer(metrics=Metrics(node="n", requests=on_log), requests=on_log),
                                        on_log),
                 "both off": (Observer(metrics=Metrics(node="n", collect=False)), None),
                 "metrics only": (Observer(metrics=Metrics(node="n")), None),
                 "request log only": (Observer(metrics=Metrics(node="n", collect=False), requests=log_only),
                                      log_only)}

    def maker(name: str) -> Callable[[], Response]:
        if name == "bare":
            return _answer
        obs = observers[name][0]
        return lambda: Observed(_answer(), Request(SCOPE), obs, Stopwatch(), Served("tiny", "local", "n"))

    best: dict[str, float] = {}
    for _ in range(reps):
        for name in ["bare", *observers]:
            make = maker(name)
            log = observers[name][1] if name in observers else None
            started = time.process_time()
            for _ in range(answers):
                await make()(SCOPE, _receive, _send)
            if log is not None:
                assert log.flush(60)  # the writer's CPU is counted too
            best[name] = min(best.get(name, float("inf")), (time.process_time() - started) / answers * 1e6)
    print(f"a {len(CHUNKS)}-chunk streamed answer, CPU per answer (min of {reps} x {answers}):")
    for name, us in best.items():
        print(f"  {name:20s} {us:7.1f} us" + ("" if name == "bare" else f"  (+{us - best['bare']:.1f} us)"))
    on_log.close()
    log_only.close()


def pieces(n: int, tmp: Path) -> None:
    """Part 2: request_done and its halves, the writer, one exposition."""
    log = RequestLog(tmp / "requests.db").start()
    obs = Observer(metrics=Metrics(node="spark", requests=log), requests=log)
    row = RequestRow(time=time.time(), node="spark", route="/api/chat", dialect="ollama",
                     model="docker.io/ai/smollm2:135m", status=200, duration=2.0, prompt_tokens=10,
                     completion_tokens=200, ttft=0.05, client="127.0.0.1")
    for name, call in (("request_done (log + metrics)", lambda: obs.request_done(row)),
                       ("RequestLog.record alone", lambda: log.record(row)),
                       ("Metrics.request_done alone", lambda: obs.metrics.request_done(row))):
        assert log.flush(60)
        seconds = timeit.timeit(call, number=n)
        started = time.perf_counter()
        assert log.flush(60)
        drained = time.perf_counter() - started
        print(f"{name:32s} {seconds / n * 1e6:7.2f} us a request; "
              f"writer drained after {drained * 1e3:.1f} ms")
    exposition = timeit.timeit(obs.metrics.exposition, number=100) / 100
    print(f"{'one /metrics exposition':32s} {exposition * 1e3:7.2f} ms")
    print(f"rows written {log.written}, dropped {log.dropped}, failed {log.failed}")
    log.close()


def main() -> None:
    """Run both parts and print them."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=9000, help="requests timed per piece (part 2)")
    parser.add_argument("--answers", type=int, default=400, help="answers per repetition (part 1)")
    parser.add_argument("--reps", type=int, default=9, help="interleaved repetitions (part 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(observed_answer(args.answers, args.reps, Path(tmp)))
        pieces(args.requests, Path(tmp))


if __name__ == "__main__":
    main()
