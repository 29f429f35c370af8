"""Spreading, replicas, fallback nodes and conversation affinity (docs/aggregation.md#spreading-and-replicas)
with real daemons.

Every daemon runs the fake llama-server with 2 slots (``LLMMAN_NUM_PARALLEL=2``) and a per-token delay, so
where a stream runs is decided by llmman's accounting of slots, not by what the 2 shared cores manage. A
stream is known to be running once its first line arrived; where it ran is read from each daemon's
``/llmman/node`` (in-flight and queued per model), ``/api/ps`` and its access log (``LLMMAN_DEBUG``).
"""

from __future__ import annotations

import itertools
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import HOP, Daemon, local_ps, start_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TINY = "docker.io/ai/tiny:latest"
REPLY = " ".join(f"w{i}" for i in range(400))  # 400 tokens: a long stream unless num_predict cuts it
LONG = 400
_conversations = itertools.count()


def opening() -> str:
    """A first message no other request of the run has: each is its own conversation (no affinity)."""
    return f"hi {next(_conversations)}"


class Daemons:
    """Daemons started by one test, stopped (children killed) at its end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[Daemon] = []

    def start(self, name: str, *, stores: bool = True, **env: str) -> Daemon:
        tmp = self.root / name
        tmp.mkdir()
        make_store(tmp, ("tiny",) if stores else ())
        (tmp / "bin").mkdir()
        binary = make_fake_binary(tmp / "bin")
        d = start_daemon(tmp, extra_env={
            "LLMMAN_LLAMA_SERVER": str(binary), "LLMMAN_DEBUG": "1", "LLMMAN_MEMORY": "4GB",
            "LLMMAN_NUM_PARALLEL": "2", "FAKE_REPLY": REPLY, "FAKE_TOKEN_DELAY": "0.05", **env})
        self.started.append(d)
        return d

    def close(self) -> None:
        for d in self.started:
            for child in d.children():
                child.kill()
            d.stop(signal.SIGKILL if d.process.poll() is None else signal.SIGTERM)


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    pool = Daemons(tmp_path)
    try:
        yield pool
    finally:
        pool.close()


class Stream(threading.Thread):
    """A streamed /api/chat read line by line until it ends or :meth:`stop` (the client goes away)."""

    def __init__(self, url: str, tokens: int = LONG, content: str | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.tokens, self.content = url, tokens, content or opening()
        self.started = threading.Event()
        self.lines: list[dict[str, Any]] = []
        self.status = 0
        self._leave = threading.Event()

    def run(self) -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": self.content}],
                "options": {"num_predict": self.tokens}}
        try:
            with httpx.stream("POST", self.url + "/api/chat", json=body, timeout=120) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if line:
                        self.lines.append(json.loads(line))
                        self.started.set()
                    if self._leave.is_set():
                        break
        except httpx.HTTPError as exc:  # the daemon went away (a failed test's teardown)
            self.lines.append({"error": repr(exc)})
        finally:
            self.started.set()

    def stop(self) -> None:
        self._leave.set()
        self.join(60)
        assert not self.is_alive()


def streams(url: str, n: int) -> list[Stream]:
    """``n`` long streams through ``url``, returned once each has its first line."""
    out = [Stream(url) for _ in range(n)]
    for s in out:
        s.start()
    for s in out:
        assert s.started.wait(60) and s.status == 200 and s.lines, (s.status, s.lines)
    return out


def chat(url: str, tokens: int = 2, headers: dict[str, str] | None = None) -> None:
    """A short streamed /api/chat, a conversation of its own, that must succeed."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": opening()}],
            "options": {"num_predict": tokens}}
    r = httpx.post(url + "/api/chat", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    assert json.loads(r.text.splitlines()[-1]).get("done") is True, r.text


def busy(d: Daemon) -> int:
    """Requests on ``d``'s own copy of tiny (in flight and queued), from its ``/llmman/node``."""
    load = httpx.get(d.url + "/llmman/node", timeout=10).json()["models"].get(TINY)
    return 0 if load is None else int(load["in_flight"]) + int(load["queued"])


def warm(front: Daemon, *others: Daemon) -> None:
    """tiny loaded on ``front`` and ``others``, and ``front``'s view of its peers showing it loaded and
    idle (the background state lags the peers by up to a refresh)."""
    for d in (front, *others):
        chat(d.url, headers=HOP)

    def seen() -> bool:
        nodes = httpx.get(front.url + "/llmman/pool", timeout=10).json()["nodes"]
        idle = {n["address"] for n in nodes
                if (m := n["models"].get(TINY)) is not None and m["in_flight"] == m["queued"] == 0}
        return all(d.url.removeprefix("http://") in idle for d in others)

    wait_until(seen, "the front node to see tiny loaded on its peers")


def posts(d: Daemon) -> int:
    """How many POST /api/chat reached ``d`` (its access log)."""
    return d.log_text().count('"POST /api/chat HTTP/1.1"')


def test_streams_through_one_node_spread_over_both_loaded_copies(daemons: Daemons) -> None:
    b = daemons.start("b", LLMMAN_SPREAD="loaded")
    a = daemons.start("a", LLMMAN_SPREAD="loaded", LLMMAN_PEERS=b.url)
    warm(a, b)
    before = posts(b)
    here = streams(a.url, 2)  # a spare slot here: served here
    assert (busy(a), busy(b), posts(b)) == (2, 0, before)
    there = streams(a.url, 2)  # every slot here busy: to the loaded peer with spare slots
    assert (busy(a), busy(b), posts(b)) == (2, 2, before + 2)
    for s in here + there:
        s.stop()
    wait_until(lambda: busy(a) == busy(b) == 0, "the streams to end on both nodes")


def test_spread_off_keeps_every_request_on_the_loaded_node(daemons: Daemons) -> None:
    b = daemons.start("b", LLMMAN_SPREAD="off")
    a = daemons.start("a", LLMMAN_SPREAD="off", LLMMAN_PEERS=b.url)
    warm(a, b)
    before = posts(b)
    running = streams(a.url, 5)
    assert (busy(a), busy(b), posts(b)) == (5, 0, before)  # 2 served, 3 waiting: never elsewhere
    for s in running:
        s.stop()


def test_a_replica_loads_under_sustained_load_and_unloads_when_it_falls(daemons: Daemons) -> None:
    b = daemons.start("b", LLMMAN_KEEP_ALIVE="2s")  # stores tiny, nothing loaded
    a = daemons.start("a", LLMMAN_PEERS=b.url, LLMMAN_REPLICA_AFTER="500ms")  # spread = replicas, the default
    chat(a.url, headers=HOP)
    running = streams(a.url, 3)  # 2 served, 1 waiting: saturated
    assert busy(a) == 3 and local_ps(b) == []

    def replica() -> bool:
        chat(a.url)  # the sustained load: each request sees every copy saturated
        return TINY in local_ps(b)

    wait_until(replica, "another copy of tiny on b", 60)
    assert posts(b) >= 1
    assert "another copy due" in a.log_text()
    for s in running:
        s.stop()
    wait_until(lambda: busy(a) == 0, "the streams on a to end")
    before = posts(b)
    for _ in range(3):  # light traffic: a's copy has spare slots, so b's copy is left idle
        chat(a.url)
    assert posts(b) == before
    wait_until(lambda: local_ps(b) == [], "the extra copy on b to unload by keep_alive", 30)
    assert local_ps(a) == [TINY] and not b.children()


def test_a_fallback_node_serves_only_when_the_primary_cannot(daemons: Daemons) -> None:
    primary = daemons.start("p")
    fallback = daemons.start("f", LLMMAN_FALLBACK="1", LLMMAN_MEMORY="64GB")  # more room, and stores it
    front = daemons.start("a", stores=False, LLMMAN_MEMORY="10KB",  # no room for tiny (24 KB)
                          LLMMAN_PEERS=f"{primary.url},{fallback.url}")
    assert httpx.get(fallback.url + "/llmman/node", timeout=10).json()["fallback"] is True
    for _ in range(2):
        chat(front.url)
    assert (local_ps(primary), local_ps(fallback), posts(fallback)) == ([TINY], [], 0)
    for child in primary.children():
        child.kill()
    primary.stop(signal.SIGKILL)
    chat(front.url)  # the primary is gone: the fallback loads it
    assert (local_ps(fallback), posts(fallback)) == ([TINY], 1)
    assert local_ps(front) == []


def test_a_conversations_next_turn_goes_where_its_first_went(daemons: Daemons) -> None:
    b = daemons.start("b")
    a = daemons.start("a", LLMMAN_PEERS=b.url)
    warm(a, b)
    running = streams(a.url, 2)  # a is full: the first turn goes to b
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": opening()}]
    before = posts(b)
    turn(a.url, first)
    assert posts(b) == before + 1
    for s in running:
        s.stop()
    wait_until(lambda: busy(a) == 0, "the streams on a to end")
    # a has free slots now, but b holds the conversation's prompt: the next turns go there.
    later = [*first, {"role": "assistant", "content": "w0 w1"}, {"role": "user", "content": "and then?"}]
    turn(a.url, later)
    assert posts(b) == before + 2
    turn(a.url, [first[0], {"role": "user", "content": opening()}])  # another conversation: served here
    assert posts(b) == before + 2


def turn(url: str, messages: list[dict[str, str]]) -> None:
    """One non-streamed /api/chat turn of a conversation that must succeed."""
    body = {"model": "tiny", "messages": messages, "stream": False, "options": {"num_predict": 2}}
    r = httpx.post(url + "/api/chat", json=body, timeout=120)
    assert r.status_code == 200 and r.json()["done"] is True, r.text
