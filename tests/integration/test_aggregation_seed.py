"""The seed's three-node experiment (docs/aggregation.md) with real daemons, llama-server and models.

The write-up's Mac (38 GB), Spark (128 GB) and Asahi box (8 GB) are scaled down by about 10.5 MB per GB,
so the real models sit in them the same way: ``mac`` (127.0.0.2, 400 MB) holds one model at a time
(loaded, SmolLM2 takes ~140-160 MB and Gemma 3 270M ~300 MB), ``spark`` (127.0.0.3, 1350 MB) holds
several, and ``asahi`` (127.0.0.4, 84 MB) is too small for either (SmolLM2's weights alone are 98 MB).
All three store ``smollm2:135m``; only the Mac stores ``gemma3:270m``. The Mac names the other two; they
name nobody (membership is not symmetric). Every daemon runs ``spread = off``, the seed's rules (spreading
is tests/integration/test_aggregation_spread.py). The last test kills the Spark.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from tests.integration.daemons import Daemon, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(600)]

SMOL, GEMMA = "smollm2:135m", "gemma3:270m"
SMOL_REF, GEMMA_REF = f"docker.io/ai/{SMOL}", f"docker.io/ai/{GEMMA}"
HOP = {"x-llmman-hop": "1"}
BASE = {"LLMMAN_CONTEXT_LENGTH": "512", "LLMMAN_DEBUG": "1", "LLMMAN_KEEP_ALIVE": "10m",
        "LLMMAN_SPREAD": "off"}  # the seed's rules: never a second copy


def _gemma_file() -> Path:
    path = Path(os.environ.get("LLMMAN_TEST_GEMMA")
                or Path.home() / ".cache/llmman/models/gemma-3-270m-q4_k_m.gguf")
    if not path.is_file():
        pytest.skip(f"Gemma 3 270M missing at {path} (set LLMMAN_TEST_GEMMA)")
    return path


@dataclass
class Seed:
    mac: Daemon
    spark: Daemon
    asahi: Daemon

    def name(self, d: Daemon) -> str:
        return d.url.removeprefix("http://")

    def all(self) -> tuple[Daemon, Daemon, Daemon]:
        return self.mac, self.spark, self.asahi


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> Iterator[Seed]:
    gemma = _gemma_file()
    dirs = {n: tmp_path_factory.mktemp(n) for n in ("mac", "spark", "asahi")}
    for tmp in dirs.values():
        Store(tmp / "store").build(parse_reference(SMOL), model_file)
    Store(dirs["mac"] / "store").build(parse_reference(GEMMA), gemma)
    started: list[Daemon] = []
    try:
        spark = start_daemon(dirs["spark"], host="127.0.0.3",
                             extra_env=BASE | {"LLMMAN_MEMORY": "1350MB", "LLMMAN_NUM_PARALLEL": "4"})
        started.append(spark)
        asahi = start_daemon(dirs["asahi"], host="127.0.0.4",
                             extra_env=BASE | {"LLMMAN_MEMORY": "84MB", "LLMMAN_NUM_PARALLEL": "1"})
        started.append(asahi)
        mac = start_daemon(dirs["mac"], host="127.0.0.2", extra_env=BASE | {
            "LLMMAN_MEMORY": "400MB", "LLMMAN_NUM_PARALLEL": "2", "LLMMAN_PEERS": f"{spark.url},{asahi.url}"})
        started.append(mac)
        yield Seed(mac, spark, asahi)
    finally:
        for d in started:
            for child in d.children():
                child.kill()
            d.stop(signal.SIGTERM if d.process.poll() is None else signal.SIGKILL)


def local_ps(d: Daemon) -> list[str]:
    """What ``d`` itself has loaded (a hopped request answers for the local node only)."""
    return [str(m["name"]) for m in httpx.get(d.url + "/api/ps", headers=HOP, timeout=10).json()["models"]]


def posts(d: Daemon) -> int:
    """How many POST /api/chat the daemon's access log shows (LLMMAN_DEBUG turns it on)."""
    return d.log_text().count('"POST /api/chat HTTP/1.1"')


def unload(d: Daemon, name: str) -> None:
    r = httpx.post(d.url + "/api/generate", json={"model": name, "keep_alive": 0}, headers=HOP, timeout=60)
    assert r.status_code == 200, r.text


Lines = list[dict[str, Any]]


def chat(url: str, model: str, n: int = 8, headers: dict[str, str] | None = None) -> tuple[int, Lines]:
    """A streamed /api/chat: (status, its NDJSON lines; for a non-200 one line holding the body)."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi"}],
            "options": {"num_predict": n, "temperature": 0}}
    with httpx.stream("POST", url + "/api/chat", json=body, headers=headers, timeout=300) as r:
        if r.status_code != 200:
            return r.status_code, [{"error": r.read().decode()}]
        return 200, [json.loads(line) for line in r.iter_lines() if line]


def ok(result: tuple[int, Lines]) -> bool:
    status, lines = result
    return status == 200 and lines[-1].get("done") is True and "error" not in lines[-1]


def test_a_cold_model_all_three_store_goes_to_the_spark(seed: Seed) -> None:
    result = chat(seed.mac.url, SMOL)
    assert ok(result), result
    assert (local_ps(seed.mac), local_ps(seed.spark), local_ps(seed.asahi)) == ([], [SMOL_REF], [])
    assert not seed.mac.children() and not seed.asahi.children() and len(seed.spark.children()) == 1
    log = seed.mac.log_text()
    assert f"placement of {SMOL_REF}: ['{seed.name(seed.spark)}'" in log, log
    merged = httpx.get(seed.mac.url + "/api/ps", timeout=10).json()["models"]
    assert [(m["name"], m["node"]) for m in merged] == [(SMOL_REF, seed.name(seed.spark))]


def test_a_model_only_the_mac_stores_stays_on_the_mac(seed: Seed) -> None:
    before = posts(seed.spark)
    result = chat(seed.mac.url, GEMMA)
    assert ok(result), result
    assert local_ps(seed.mac) == [GEMMA_REF]
    assert local_ps(seed.spark) == [SMOL_REF]  # the Spark had more room, but not the model
    assert posts(seed.spark) == before


def test_twelve_streams_to_the_mac_land_where_the_model_is_loaded(seed: Seed) -> None:
    assert local_ps(seed.spark) == [SMOL_REF]
    before = posts(seed.spark), posts(seed.mac)
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda _: chat(seed.mac.url, SMOL, 4), range(12)))
    assert all(ok(r) for r in results), results
    assert (posts(seed.spark) - before[0], posts(seed.mac) - before[1]) == (12, 12)
    assert len(seed.spark.children()) == 1 and not seed.asahi.children()
    assert SMOL_REF not in local_ps(seed.mac) and local_ps(seed.asahi) == []


def test_the_spark_names_nobody_and_never_forwards_back(seed: Seed) -> None:
    assert local_ps(seed.mac) == [GEMMA_REF]
    mac_before = posts(seed.mac)
    status, lines = chat(seed.spark.url, GEMMA)  # loaded on the Mac, which the Spark does not know
    assert status == 404, lines
    assert posts(seed.mac) == mac_before and local_ps(seed.spark) == [SMOL_REF]
    assert "placement of" not in seed.spark.log_text()
    # The Spark answers for itself alone; the Mac for the aggregation, naming each entry's node.
    spark_ps = httpx.get(seed.spark.url + "/api/ps", timeout=10).json()["models"]
    assert [(m["name"], m.get("node")) for m in spark_ps] == [(SMOL_REF, None)]
    mac_ps = httpx.get(seed.mac.url + "/api/ps", timeout=10).json()["models"]
    assert sorted((m["name"], m["node"]) for m in mac_ps) == [
        (GEMMA_REF, "local"), (SMOL_REF, seed.name(seed.spark))]


def test_killing_the_spark_mid_run_costs_only_its_streams(seed: Seed) -> None:
    assert local_ps(seed.spark) == [SMOL_REF] and local_ps(seed.mac) == [GEMMA_REF]
    spark_lines: list[list[dict[str, Any]]] = [[], []]
    started = [threading.Event(), threading.Event()]

    def spark_stream(i: int) -> None:
        body = {"model": SMOL, "messages": [{"role": "user", "content": "Count to one hundred."}],
                "options": {"num_predict": 400, "temperature": 0}}
        with httpx.stream("POST", seed.mac.url + "/api/chat", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line:
                    spark_lines[i].append(json.loads(line))
                    started[i].set()
        started[i].set()

    readers = [threading.Thread(target=spark_stream, args=(i,)) for i in range(2)]
    for t in readers:
        t.start()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        local = [pool.submit(chat, seed.mac.url, GEMMA, 24) for _ in range(2)]
        assert all(e.wait(120) for e in started)
        children = seed.spark.children()
        seed.spark.process.kill()
        for child in children:
            child.kill()
        psutil.wait_procs(children, timeout=10)
        seed.spark.process.wait(10)
        local_results = [f.result(timeout=300) for f in local]
    for t in readers:
        t.join(60)
        assert not t.is_alive()
    for lines in spark_lines:  # each broken stream ended without claiming success
        assert lines and lines[-1].get("done") is not True, lines[-3:]
    assert all(ok(r) for r in local_results), local_results
    # The next request for the Spark's model goes elsewhere: the Asahi is too small, so the Mac loads it.
    result = chat(seed.mac.url, SMOL)
    assert ok(result), result
    assert SMOL_REF in local_ps(seed.mac) and local_ps(seed.asahi) == []
    assert seed.mac.log_text().count(f"peer {seed.name(seed.spark)} left out") == 1
