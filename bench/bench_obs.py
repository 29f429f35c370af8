"""Benchmark: what the operator's view costs per request, in process (llmman.obs).

Usage: ``.venv/bin/python bench/bench_obs.py [--requests N]``. Times, per request, what the data path will
call once per finished request (:meth:`llmman.obs.observer.Observer.request_done`: the request log's
non-blocking enqueue and the metric updates), each half alone, how long the writer thread takes to put
the rows in SQLite (a real file in a temporary folder), and one ``/metrics`` exposition. The relay's
end-to-end figure at 1, 16 and 256 streams (issue 12's bench) needs the calls wired into the relay first.
Timings are only reported, never asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import timeit
from pathlib import Path

from llmman.obs.metrics import Metrics
from llmman.obs.observer import Observer
from llmman.obs.requestlog import RequestLog, RequestRow


def main() -> None:
    """Run the timings and print them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=9000, help="requests timed per figure")
    n = parser.parse_args().requests
    with tempfile.TemporaryDirectory() as tmp:
        log = RequestLog(Path(tmp) / "requests.db").start()
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


if __name__ == "__main__":
    main()
