"""A running daemon's lists follow its store when another process changes it (llmman.store.listing).

The daemon keeps its listing in memory; the real ``llmman tag``, ``rm`` and ``build`` commands (their own
processes, ``--store`` so they write the files directly) change the store under it, and the next
``/api/tags``, ``/v1/models`` and ``/llmman/node`` show the change. First the test waits until the
store's stamps are older than the clock tick the listing guards against (llmman.store.listing.RACY_S):
from then on the daemon answers from its kept listing without reading the store, which is the case to
prove. Through a hop the front node's pooled ``/api/tags`` and ``/v1/models`` show what changed in the
back node's store. No model is loaded: the stored models are tiny synthetic GGUFs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from llmman.store.listing import RACY_S
from tests.integration.daemons import REPO, Daemon, hop_pair, start_daemon, wait_until
from tests.unit.ggufgen import write_gguf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def stored(tmp: Path, *names: str) -> Path:
    """A store under ``tmp`` with a tiny model under each of ``names``; returns ``tmp``."""
    store = Store(tmp / "store")
    for i, name in enumerate(names):
        store.build(parse_reference(name), write_gguf(tmp / "src" / f"m{i}.gguf", name=f"model {i}"))
    return tmp


def cli(store: Path, *args: str) -> None:
    """The real ``llmman`` command on ``store`` directly, in its own process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_"))}
    done = subprocess.run([sys.executable, "-m", "llmman", "--store", str(store), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def lists(url: str, *, node: bool = True) -> dict[str, set[str]]:
    """The names each list route of ``url`` answers."""
    out = {"/api/tags": {m["name"] for m in httpx.get(url + "/api/tags", timeout=30).json()["models"]},
           "/v1/models": {m["id"] for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]}}
    if node:
        out["/llmman/node"] = set(httpx.get(url + "/llmman/node", timeout=30).json()["stored"])
    return out


def old_enough(store: Path) -> bool:
    """True once every stamp of ``store`` a listing compares is older than RACY_S."""
    newest = max(max(st.st_mtime, st.st_ctime) for st in (os.stat(store / "index.json"),
                                                          os.stat(store / "blobs" / "sha256")))
    return time.time() - newest > RACY_S + 0.1


def every(d: Daemon | str, names: set[str], *, node: bool = True) -> None:
    url = d if isinstance(d, str) else d.url
    found = lists(url, node=node)
    assert all(got == names for got in found.values()), found


def test_a_running_daemon_lists_what_other_processes_wrote(tmp_path: Path) -> None:
    tmp = stored(tmp_path, "alpha:1", "beta:2")
    d = start_daemon(tmp)
    try:
        a, b = "docker.io/ai/alpha:1", "docker.io/ai/beta:2"
        every(d, {a, b})
        wait_until(lambda: old_enough(d.store), "the store's stamps to be older than the clock tick")
        every(d, {a, b})  # read now, with old stamps: kept from here on
        every(d, {a, b})
        cli(d.store, "tag", "alpha:1", "gamma:3")
        every(d, {a, b, "docker.io/ai/gamma:3"})
        cli(d.store, "rm", "beta:2")
        every(d, {a, "docker.io/ai/gamma:3"})
        cli(d.store, "build", "-t", "delta:4", str(write_gguf(tmp / "src" / "new.gguf", name="new")))
        every(d, {a, "docker.io/ai/gamma:3", "docker.io/ai/delta:4"})
        models = httpx.get(d.url + "/api/tags", timeout=30).json()["models"]
        delta = next(m for m in models if m["name"] == "docker.io/ai/delta:4")
        assert delta["details"]["family"] == "llama" and models[0]["name"] == "docker.io/ai/delta:4"
    finally:
        d.stop()


def test_through_a_hop_the_pooled_lists_follow_the_peers_store(tmp_path: Path) -> None:
    back, front = stored(tmp_path / "back", "alpha:1"), tmp_path / "front"
    front.mkdir()
    with hop_pair(back, front, ("127.0.0.81", "127.0.0.82")) as nodes:
        a = "docker.io/ai/alpha:1"
        every(nodes.front.url, {a}, node=False)
        wait_until(lambda: old_enough(nodes.back.store), "the store's stamps to be older than the clock tick")
        every(nodes.front.url, {a}, node=False)
        cli(nodes.back.store, "tag", "alpha:1", "beta:2")
        every(nodes.front.url, {a, "docker.io/ai/beta:2"}, node=False)
        cli(nodes.back.store, "rm", "alpha:1")
        every(nodes.front.url, {"docker.io/ai/beta:2"}, node=False)
