"""Draining with real daemons whose llama-server is the fake: ``llmman stop`` under steady traffic takes
effect, ``llmman drain`` empties a node without losing a request (``--wait`` returns once it is empty),
the drain routes find a node by name or address and forward to it, and a client that leaves during a cold
load, here or through a front node, leaves no child behind.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import HOP, Daemon, free_port, start_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KEY = {"Authorization": "Bearer pool"}
REPLY = " ".join(f"w{i}" for i in range(40))
SLOW_REPLY = " ".join(f"s{i}" for i in range(200))


def ref(name: str) -> str:
    return f"docker.io/ai/{name}:latest"


def fake_daemon(tmp: Path, env: dict[str, str], names: tuple[str, ...] = ("tiny",), *,
                host: str = "127.0.0.1", port: int | None = None) -> Daemon:
    """A daemon over a store of tiny GGUFs whose llama-server is the fake; the API key ``pool``."""
    make_store(tmp, names)
    (tmp / "bin").mkdir()
    per_model = {ref("slow"): {"FAKE_REPLY": SLOW_REPLY, "FAKE_TOKEN_DELAY": "0.04"},
                 ref("gated"): {"FAKE_LOAD_GATE": str(tmp / "never")}}
    return start_daemon(tmp, host=host, port=port, extra_env={
        "LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_MEMORY": "4GB",
        "LLMMAN_API_KEYS": "pool", "LLMMAN_NUM_PARALLEL": "2", "FAKE_REPLY": REPLY,
        "FAKE_TOKEN_DELAY": "0.02", "FAKE_PER_MODEL": json.dumps(per_model), **env})


def chat(url: str, model: str = "tiny", headers: dict[str, str] | None = None) -> str:
    """A streamed /api/chat; the whole content, or ``ERROR: ...`` when it failed in any way."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    try:
        with httpx.stream("POST", url + "/api/chat", json=body, headers={**KEY, **(headers or {})},
                          timeout=60) as r:
            if r.status_code != 200:
                return f"ERROR: {r.status_code} {r.read().decode()}"
            lines = [json.loads(line) for line in r.iter_lines() if line]
    except httpx.HTTPError as exc:
        return f"ERROR: {exc!r}"
    if "error" in lines[-1] or not lines[-1].get("done"):
        return f"ERROR: {lines[-1]}"
    return "".join(str(x.get("message", {}).get("content", "")) for x in lines)


@dataclass
class Traffic:
    """``threads`` clients sending one streamed chat after another to ``url`` until stopped."""

    url: str
    model: str = "tiny"
    threads: int = 3
    answers: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Traffic:
        for _ in range(self.threads):
            worker = threading.Thread(target=self._run, daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            self.answers.append(chat(self.url, self.model))

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for worker in self._workers:
            worker.join(timeout=90)


@dataclass
class Chain:
    """Overlapping traffic to ``url``: each streamed chat starts the next one halfway through its answer,
    so a request always holds the model (it is never idle, which would unload it anyway) until stopped."""

    url: str
    answers: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Chain:
        self._next()
        return self

    def _next(self) -> None:
        with self._lock:
            if not self.stop.is_set():
                worker = threading.Thread(target=self._one, daemon=True)
                self._workers.append(worker)
                worker.start()

    def _one(self) -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        parts: list[str] = []
        started_next = False
        try:
            with httpx.stream("POST", self.url + "/api/chat", json=body, headers=KEY, timeout=60) as r:
                for line in r.iter_lines():
                    if not line:
                        continue
                    chunk = json.loads(line)
                    parts.append(str(chunk.get("message", {}).get("content", "")) if "error" not in chunk
                                 else f"ERROR: {chunk}")
                    if not started_next and len(parts) >= len(REPLY.split()) // 2:
                        started_next = True
                        self._next()
        except httpx.HTTPError as exc:
            parts.append(f"ERROR: {exc!r}")
        self.answers.append("".join(parts))
        if not started_next:
            self._next()

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.stop.set()
        for worker in list(self._workers):
            worker.join(timeout=90)


def ps(d: Daemon) -> list[dict[str, Any]]:
    r = httpx.get(d.url + "/api/ps", headers={**KEY, **HOP}, timeout=10)
    r.raise_for_status()
    return list(r.json()["models"])


def pids(d: Daemon, name: str = "tiny") -> list[int]:
    return [int(m["pid"]) for m in ps(d) if m["name"] == ref(name) and m.get("pid")]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def drain_state(d: Daemon, node: str = "") -> dict[str, Any]:
    r = httpx.get(d.url + "/llmman/drain", params={"node": node} if node else None, headers=KEY, timeout=10)
    r.raise_for_status()
    return dict(r.json())


def node_state(d: Daemon) -> str:
    r = httpx.get(d.url + "/llmman/node", headers={**KEY, **HOP}, timeout=10)
    return str(r.json()["state"])


@pytest.fixture()
def single(tmp_path: Path) -> Iterator[Daemon]:
    d = fake_daemon(tmp_path, {"LLMMAN_NODE_NAME": "solo"}, ("tiny", "slow", "gated"))
    yield d
    d.stop()


# ---------------------------------------------------------------------------------- stopping a model
def test_stop_under_steady_traffic_takes_effect_and_loses_nothing(single: Daemon) -> None:
    with Chain(single.url) as traffic:
        wait_until(lambda: len(traffic.answers) >= 3 and len(pids(single)) == 1,
                   "steady traffic on one child")
        (old,) = pids(single)
        r = httpx.post(single.url + "/api/generate", json={"model": "tiny", "keep_alive": 0}, headers=KEY,
                       timeout=30)
        assert r.status_code == 200 and r.json()["done_reason"] == "unload"
        # The requests on the old child finish, it exits, and the ones that kept coming load a new one.
        wait_until(lambda: not alive(old), "the stopped child to exit although requests keep coming")
        wait_until(lambda: (p := pids(single)) != [] and p != [old], "a fresh child for the later requests")
        before = len(traffic.answers)
        wait_until(lambda: len(traffic.answers) >= before + 3, "the traffic to go on on the fresh child")
    assert traffic.answers and all(a == REPLY for a in traffic.answers), [
        a for a in traffic.answers if a != REPLY][:3]


# ---------------------------------------------------------------------------------- draining the node
def test_drain_with_traffic_finishes_every_request_and_ends_with_no_children(single: Daemon) -> None:
    for name in ("tiny", "slow"):  # two models loaded, one kept 5 minutes, the other forever
        body = {"model": name, "keep_alive": -1 if name == "slow" else "5m"}
        httpx.post(single.url + "/api/generate", json=body, headers=KEY, timeout=30).raise_for_status()
    with Traffic(single.url) as traffic:
        wait_until(lambda: len(traffic.answers) >= 2, "traffic running")
        r = httpx.post(single.url + "/llmman/drain", headers=KEY, timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["node"] == "solo" and r.json()["state"] == "draining"
        assert node_state(single) == "draining"
        wait_until(lambda: ref("slow") not in [m["name"] for m in ps(single)], "the idle pinned model to go")
        served = len(traffic.answers)
        wait_until(lambda: len(traffic.answers) >= served + 3, "the draining node to go on serving")
    wait_until(lambda: (s := drain_state(single))["in_flight"] == 0 and s["loaded"] == 0,
               "the node to have nothing left")
    assert single.children() == []
    assert all(a == REPLY for a in traffic.answers), [a for a in traffic.answers if a != REPLY][:3]
    r = httpx.post(single.url + "/llmman/undrain", headers=KEY, timeout=10)
    assert r.json()["state"] == "serving" and node_state(single) == "serving"
    assert chat(single.url) == REPLY
    assert len(pids(single)) == 1  # serving again: the model stays for its keep_alive


def cli(d: Daemon, *args: str) -> subprocess.Popen[str]:
    env = {**d.env, "LLMMAN_API_KEY": "pool"}
    return subprocess.Popen([sys.executable, "-m", "llmman", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=d.home)


def test_llmman_drain_wait_returns_once_the_last_request_is_done(single: Daemon) -> None:
    answers: list[str] = []
    stream = threading.Thread(target=lambda: answers.append(chat(single.url, "slow")))
    stream.start()
    wait_until(lambda: drain_state(single)["in_flight"] == 1, "a long answer in flight")
    with cli(single, "drain", "--wait") as proc:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []))
        reader.start()
        wait_until(lambda: any("solo: draining, 1 request," in line for line in lines),
                   "the first progress line")
        stream.join(timeout=60)
        assert answers == [SLOW_REPLY]
        assert proc.poll() is None and not any(": drained" in line for line in lines)  # it was waiting
        assert proc.wait(timeout=30) == 0
        reader.join(timeout=10)
    assert lines[-1].strip() == "solo: drained", lines
    assert single.children() == []
    undrain = cli(single, "undrain")
    out, _ = undrain.communicate(timeout=30)
    assert undrain.returncode == 0 and out.startswith("solo: serving"), out


# ---------------------------------------------------------------------------- the routes, in a pool
@dataclass
class Pool:
    front: Daemon  # "ay": stores nothing, names "bee"
    back: Daemon  # "bee": stores the models


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    hosts = "127.0.0.41", "127.0.0.42"
    ports = free_port(hosts[0]), free_port(hosts[1])
    back = fake_daemon(tmp_path_factory.mktemp("bee"), {
        "LLMMAN_NODE_NAME": "bee", "LLMMAN_PEERS": f"{hosts[0]}:{ports[0]}"}, ("tiny", "gated"),
        host=hosts[1], port=ports[1])
    try:
        front = fake_daemon(tmp_path_factory.mktemp("ay"), {
            "LLMMAN_NODE_NAME": "ay", "LLMMAN_PEERS": f"{hosts[1]}:{ports[1]}"}, (),
            host=hosts[0], port=ports[0])
        try:
            yield Pool(front, back)
        finally:
            front.stop()
    finally:
        back.stop()


def test_drain_routes_name_this_node_a_peer_or_nobody(pool: Pool) -> None:
    front, back = pool.front, pool.back
    url = front.url + "/llmman/drain"
    r = httpx.post(url, json={"node": "bee"}, headers=KEY, timeout=10)  # by the name the peer reports
    assert r.status_code == 200, r.text
    assert r.json() == {"node": "bee", "state": "draining", "in_flight": 0, "loaded": 0}
    assert node_state(back) == "draining" and node_state(front) == "serving"
    assert drain_state(front, "bee")["state"] == "draining"
    address = back.url.removeprefix("http://")
    r = httpx.post(front.url + "/llmman/undrain", json={"node": address}, headers=KEY, timeout=10)
    assert r.status_code == 200 and r.json()["state"] == "serving" and node_state(back) == "serving"

    for body in (None, {}, {"node": "ay"}, {"node": front.url.removeprefix("http://")}):
        r = httpx.post(url, json=body, headers=KEY, timeout=10)
        assert r.status_code == 200 and r.json()["node"] == "ay" and r.json()["state"] == "draining", body
        assert node_state(front) == "draining" and node_state(back) == "serving"
        httpx.post(front.url + "/llmman/undrain", json=body, headers=KEY, timeout=10).raise_for_status()
        assert node_state(front) == "serving"

    r = httpx.post(url, json={"node": "nobody"}, headers=KEY, timeout=10)
    assert r.status_code == 404 and "nobody" in r.json()["error"]
    r = httpx.post(url, json={"node": "bee"}, headers={**KEY, **HOP}, timeout=10)  # a hop is never sent on
    assert r.status_code == 404 and node_state(back) == "serving"
    assert httpx.post(url, json={"node": 5}, headers=KEY, timeout=10).status_code == 400
    assert httpx.post(url, timeout=10).status_code == 401  # behind the API key like every route
    assert node_state(front) == "serving"


def send_raw(d: Daemon, body: dict[str, Any]) -> socket.socket:
    """One POST /api/chat on a raw socket (the caller closes it to disconnect)."""
    url = httpx.URL(d.url)
    sock = socket.create_connection((url.host, url.port or 80), timeout=10)
    payload = json.dumps(body).encode()
    sock.sendall(f"POST /api/chat HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: application/json\r\n"
                 f"Authorization: Bearer pool\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def gated_children(d: Daemon) -> list[psutil.Process]:
    return [c for c in d.children() if ref("gated") in " ".join(c.cmdline())]


@pytest.mark.parametrize("stream", [False, True], ids=["non-streamed", "streamed"])
def test_client_leaving_a_cold_load_through_a_front_node_leaves_no_child(pool: Pool, stream: bool) -> None:
    """``ay`` forwards to ``bee``, whose load never finishes by itself; the client leaves ``ay``, which
    closes its connection to ``bee``, whose request (the load's only waiter) is cancelled, and so the load."""
    body = {"model": "gated", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    with send_raw(pool.front, body):
        wait_until(lambda: len(gated_children(pool.back)) == 1, "bee to be loading the model")
        (child,) = gated_children(pool.back)
    wait_until(lambda: not alive(child.pid), "bee to kill the child of a load nobody waits for")
    wait_until(lambda: ref("gated") not in [m["name"] for m in ps(pool.back)], "bee's table to forget it")
    assert gated_children(pool.front) == []


def test_client_leaving_a_streamed_cold_load_leaves_no_child(single: Daemon) -> None:
    """The local path, streamed (tests/integration/test_faults_fake.py has the non-streamed one)."""
    body = {"model": "gated", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with send_raw(single, body):
        wait_until(lambda: len(gated_children(single)) == 1, "the model to be loading")
        (child,) = gated_children(single)
    wait_until(lambda: not alive(child.pid), "the child of a load nobody waits for to be killed")
    wait_until(lambda: ps(single) == [], "the table to forget it")



@pytest.fixture()
def duo(tmp_path: Path) -> Iterator[Pool]:
    """Two nodes that both store ``tiny`` and name each other: ``ay`` (the clients' front) and ``bee``."""
    hosts = "127.0.0.43", "127.0.0.44"
    ports = free_port(hosts[0]), free_port(hosts[1])
    def env(name: str, peer: int) -> dict[str, str]:
        return {"LLMMAN_NODE_NAME": name, "LLMMAN_PEERS": f"{hosts[peer]}:{ports[peer]}",
                "LLMMAN_PEER_REFRESH": "200ms"}

    back = fake_daemon(tmp_path / "bee", env("bee", 0), host=hosts[1], port=ports[1])
    try:
        front = fake_daemon(tmp_path / "ay", env("ay", 1), host=hosts[0], port=ports[0])
        try:
            yield Pool(front, back)
        finally:
            front.stop()
    finally:
        back.stop()


def pool_state(d: Daemon, name: str) -> str:
    """The state ``d``'s ``/llmman/pool`` gives the node named ``name``."""
    r = httpx.get(d.url + "/llmman/pool", headers=KEY, timeout=10)
    r.raise_for_status()
    return next(str(n["state"]) for n in r.json()["nodes"] if n["name"] == name)


@pytest.mark.parametrize("which", ["peer", "front"])
def test_drain_in_a_pool_moves_the_traffic_off_the_node_and_loses_nothing(duo: Pool, which: str) -> None:
    """Steady traffic through ``ay``, both nodes serving; draining one of them (``bee``, or ``ay`` itself,
    which then forwards) ends with no child there while the other serves every request."""
    front, back = duo.front, duo.back
    for d in (front, back):  # a copy on each node
        r = httpx.post(d.url + "/api/generate", json={"model": "tiny", "keep_alive": "5m"},
                       headers={**KEY, **HOP}, timeout=30)
        r.raise_for_status()
    drained, other, name = (back, front, "bee") if which == "peer" else (front, back, "ay")
    with Traffic(front.url) as traffic:
        wait_until(lambda: len(traffic.answers) >= 3, "traffic running")
        r = httpx.post(front.url + "/llmman/drain", json={"node": name}, headers=KEY, timeout=10)
        assert r.status_code == 200 and r.json()["state"] == "draining", r.text
        wait_until(lambda: pool_state(front, name) == "draining", "ay to see the node draining")
        wait_until(lambda: drained.children() == [] and drain_state(front, name)["in_flight"] == 0,
                   "the drained node to finish its requests and unload")
        loads = drained.log_text().count("loading docker.io/ai/tiny")
        served = len(traffic.answers)
        wait_until(lambda: len(traffic.answers) >= served + 6, "the other node to take the traffic")
        assert drained.children() == [] and other.children() != []
        assert drained.log_text().count("loading docker.io/ai/tiny") == loads  # nothing placed on it
    assert all(a == REPLY for a in traffic.answers), [a for a in traffic.answers if a != REPLY][:3]
    assert drain_state(front, name)["loaded"] == 0
    httpx.post(front.url + "/llmman/undrain", json={"node": name}, headers=KEY, timeout=10).raise_for_status()
    wait_until(lambda: pool_state(front, name) == "up", "the node back in the pool")


def test_a_stopped_model_shows_stopping_until_its_requests_finish(single: Daemon) -> None:
    answers: list[str] = []
    stream = threading.Thread(target=lambda: answers.append(chat(single.url, "slow")))
    stream.start()
    wait_until(lambda: drain_state(single)["in_flight"] == 1, "a long answer in flight")
    with cli(single, "stop", "slow") as proc:
        assert proc.wait(timeout=30) == 0
    (entry,) = [m for m in ps(single) if m["name"] == ref("slow")]
    assert entry.get("draining") is True
    with cli(single, "ps") as proc:
        table = (proc.stdout.read() if proc.stdout else "").splitlines()
        assert proc.wait(timeout=30) == 0
    assert any(ref("slow") in line and line.rstrip().endswith("Stopping...") for line in table), table
    stream.join(timeout=60)
    assert answers == [SLOW_REPLY]
    wait_until(lambda: ref("slow") not in [m["name"] for m in ps(single)], "the stopped model to go")
