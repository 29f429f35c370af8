"""``llmman stop`` drains a model wherever it is in the pool: with a copy loaded on each of two real daemons
(their llama-server the fake), one stop sent to either node unloads both copies, and a stop for a model
loaded only on the peer reaches it. The CLI's own path (``llmman stop``) is the one tested."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import HOP, Daemon, free_port, local_ps, start_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

HOSTS = {"a": "127.0.0.71", "b": "127.0.0.72"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Daemon]]:
    ports = {n: free_port(h) for n, h in HOSTS.items()}
    started: list[Daemon] = []
    try:
        for name, other in (("a", "b"), ("b", "a")):
            tmp = tmp_path_factory.mktemp(name)
            make_store(tmp, ("tiny",))
            (tmp / "bin").mkdir()
            started.append(start_daemon(tmp, host=HOSTS[name], port=ports[name], extra_env={
                "LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_NODE_NAME": f"node-{name}",
                "LLMMAN_PEERS": f"{HOSTS[other]}:{ports[other]}", "LLMMAN_MEMORY": "4GB"}))
        yield started[0], started[1]
    finally:
        for d in started:
            d.stop(signal.SIGTERM)


def load_on(d: Daemon) -> None:
    """Load ``tiny`` on ``d`` itself (a hopped request is served where it arrives)."""
    r = httpx.post(d.url + "/api/generate", json={"model": "tiny"}, headers=HOP, timeout=60)
    assert r.status_code == 200, r.text
    assert local_ps(d) == ["docker.io/ai/tiny:latest"]


def stop(d: Daemon, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmman", "stop", "tiny"], capture_output=True, text=True,
                          timeout=60, env={"HOME": str(home), "LLMMAN_HOST": d.url, "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("front", ["a", "b"])
def test_one_stop_unloads_every_copy(pair: tuple[Daemon, Daemon], front: str, tmp_path: Path) -> None:
    a, b = pair
    for d in (a, b):
        load_on(d)
    done = stop(a if front == "a" else b, tmp_path)
    assert done.returncode == 0, done.stderr
    for d in (a, b):
        wait_until(lambda d=d: local_ps(d) == [], f"the copy on {d.url} to unload")  # type: ignore[misc]


def test_a_stop_reaches_a_copy_loaded_only_on_the_peer(pair: tuple[Daemon, Daemon], tmp_path: Path) -> None:
    a, b = pair
    load_on(b)
    assert local_ps(a) == []
    done = stop(a, tmp_path)
    assert done.returncode == 0, done.stderr
    wait_until(lambda: local_ps(b) == [], "the copy on node-b to unload")
