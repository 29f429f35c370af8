"""Pulls and copies in progress, seen in ``/llmman/node``'s ``transfers`` (llmman.registry.progress) while
they run, on real daemons with the real SmolLM2.

A :class:`~tests.integration.holding_proxy.HoldingProxy` sits between the daemon and what it fetches from
(Debian's ``docker-registry`` for a pull, a peer daemon's ``/v2/`` for a copy) and holds the blob half
sent: the test sees the transfer listed with part of its bytes, lets it go, and sees it leave the list
when it ends; a cold ``llmman run``'s line says how far the pull is. A pull of a tag the registry lacks
stays listed a while with its error. The progress stream carries the headers that keep a reverse proxy
from buffering it.
"""

from __future__ import annotations

import io
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from llmman.cli.client import DaemonClient
from llmman.cli.coldstart import Waiting
from llmman.refs import parse_reference
from llmman.registry.push import push
from llmman.store import Store
from tests.integration.daemons import HOP, Daemon, free_port, start_daemon, wait_until
from tests.integration.holding_proxy import HoldingProxy
from tests.integration.registry import Registry, available, start_registry

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(300),
              pytest.mark.skipif(not available(), reason="docker-registry missing")]

HOLD_AFTER = 4 << 20  # bytes of a connection passed before it is held (the model is ~92 MB)
COPIED = "smollm2:copy"
BASE = {"LLMMAN_NUM_PARALLEL": "1", "LLMMAN_CONTEXT_LENGTH": "1024"}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    mp = pytest.MonkeyPatch()
    mp.setenv("LLMMAN_INSECURE_REGISTRIES", reg.host)
    store = Store(tmp_path_factory.mktemp("src") / "store")
    ref = parse_reference(f"{reg.host}/ai/smollm2:135m")
    store.build(ref, model_file)
    push(store, ref, None, lambda _: None)
    mp.undo()
    yield reg
    reg.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path / "node", extra_env=BASE)
    yield d
    d.stop(signal.SIGTERM)


def transfers(d: Daemon) -> list[dict[str, Any]]:
    r = httpx.get(d.url + "/llmman/node", timeout=10)
    r.raise_for_status()
    return list(r.json()["transfers"])


def under_way(d: Daemon, model: str) -> dict[str, Any] | None:
    """``model``'s transfer on ``d`` once part of its bytes, and not all, have come (else None)."""
    found = next((t for t in transfers(d) if t["model"] == model), None)
    if found is None or not 0 < found["completed"] < found["total"]:
        return None
    return found


def _target(host: str) -> tuple[str, int]:
    name, port = host.rsplit(":", 1)
    return name, int(port)


def test_a_pull_is_listed_while_it_runs_then_leaves_the_list(registry: Registry, node: Daemon,
                                                              model_file: Path) -> None:
    proxy = HoldingProxy(_target(registry.host), hold_after=HOLD_AFTER)
    name = f"{proxy.host}/ai/smollm2:135m"
    lines: list[dict[str, Any]] = []
    answer: dict[str, str] = {}

    def pull() -> None:
        with httpx.stream("POST", node.url + "/api/pull", json={"model": name, "insecure": True},
                          timeout=120) as r:
            answer.update(r.headers)
            lines.extend(orjson.loads(line) for line in r.iter_lines() if line.strip())

    worker = threading.Thread(target=pull)
    worker.start()
    try:
        wait_until(proxy.held.is_set, "the blob held half sent")
        wait_until(lambda: under_way(node, name) is not None, "the pull listed with part of its bytes")
        entry = under_way(node, name)
        assert entry is not None
        assert entry["kind"] == "pull" and entry["source"] == proxy.host and "error" not in entry
        assert entry["total"] > model_file.stat().st_size  # the manifest's blobs: the GGUF and its config
        assert entry["status"].startswith("pulling ")
        shown = httpx.get(node.url + "/llmman/devices", timeout=10).json()["nodes"][0]["transfers"]
        assert [t["model"] for t in shown] == [name]  # what the dashboard reads
        waiting = Waiting(DaemonClient(node.url), name, name, stored_here=False, source=None,
                          err=io.StringIO())  # a cold `llmman run`'s line, one look
        waiting._look()
        assert re.fullmatch(rf"pulling {re.escape(name)}… \d+ % \(.+ / .+ MB\)", waiting._text())
    finally:
        proxy.release()
        worker.join(timeout=120)
        proxy.close()
    assert lines[-1] == {"status": "success"}, lines[-3:]
    assert answer["x-accel-buffering"] == "no" and answer["cache-control"] == "no-cache"
    wait_until(lambda: transfers(node) == [], "the pull gone from the list once it ended")


def test_a_failed_pull_stays_listed_with_its_error(registry: Registry, node: Daemon) -> None:
    name = f"{registry.host}/ai/nothing:here"
    r = httpx.post(node.url + "/api/pull", json={"model": name, "insecure": True, "stream": False},
                   timeout=60)
    assert r.status_code == 404, r.text
    [entry] = transfers(node)
    assert entry["model"] == name and entry["kind"] == "pull" and entry["error"]


def test_a_copy_from_a_peer_is_listed_while_it_runs(tmp_path: Path, model_file: Path) -> None:
    """``x-llmman-source`` makes ``b`` copy from its peer ``a`` (through the proxy, ``b``'s configured
    peer); ``a``, whose peer is ``b``, shows ``b``'s copy in its pool-wide list (what its dashboard
    reads)."""
    Store(tmp_path / "a" / "store").build(parse_reference(COPIED), model_file)
    b_port = free_port()
    a = start_daemon(tmp_path / "a", extra_env=BASE | {"LLMMAN_PEERS": f"127.0.0.1:{b_port}"})
    proxy = HoldingProxy(_target(a.url.removeprefix("http://")), hold_after=HOLD_AFTER)
    b = None
    try:
        b = start_daemon(tmp_path / "b", port=b_port, extra_env=BASE | {"LLMMAN_PEERS": proxy.host})
        outcome: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: outcome.append(httpx.post(
            b.url + "/api/generate", headers=HOP | {"x-llmman-source": f"http://{proxy.host}"},
            json={"model": COPIED}, timeout=180)))
        worker.start()
        try:
            model = str(parse_reference(COPIED))
            wait_until(lambda: under_way(b, model) is not None, "the copy listed with part of its bytes")
            entry = under_way(b, model)
            assert entry is not None and entry["kind"] == "copy" and entry["source"] == proxy.host

            def seen_from_a() -> list[str]:
                nodes = httpx.get(a.url + "/llmman/devices?pool=1", timeout=10).json()["nodes"]
                peers = [n for n in nodes if not n["self"]]
                return [t["kind"] for n in peers for t in n["transfers"] if t["model"] == model]

            wait_until(lambda: seen_from_a() == ["copy"], "b's copy in a's pool-wide list")
        finally:
            proxy.release()
            worker.join(timeout=180)
        assert outcome and outcome[0].status_code == 200, outcome and outcome[0].text
        assert transfers(b) == []
    finally:
        if b is not None:
            b.stop(signal.SIGTERM)
        proxy.close()
        a.stop(signal.SIGTERM)
