"""Lending ``ggml-rpc-server`` workers (docs/split.md, "Lending workers") from real ``llmman serve`` daemons:
a lease starts a real worker that listens at its endpoint, ``/llmman/node`` shows what it reserves, a load
that needs the reserved bytes is refused and an idle model is unloaded to make room, an expired lease stops
the process, a worker killed by -9 answers 404 and frees its memory, no worker outlives its daemon (SIGTERM
or SIGKILL), and a real llama-server ``--rpc`` at a lent worker puts Gemma's layers on it and answers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from tests.integration.conftest import MODEL_NAME, MODEL_REF, _llama_server
from tests.integration.daemons import Daemon, free_port, start_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(300)]

WORKERS = "/llmman/rpc/workers"
MIB = 1 << 20
CAPACITY = 1024 * MIB  # resources.memory of the lending daemons


def rpc_children(d: Daemon) -> list[psutil.Process]:
    """The ggml-rpc-server processes ``d`` started."""
    try:
        kids = psutil.Process(d.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for kid in kids:
        try:
            if "ggml-rpc-server" in " ".join(kid.cmdline()):
                out.append(kid)
        except psutil.Error:
            pass
    return out


def gone(pid: int) -> bool:
    """Exited and reaped: no such process any more (a zombie still exists)."""
    try:
        psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return True
    return False


def worker_pid(port: int) -> int:
    """The pid of the process listening on TCP ``port`` (the worker itself, not its daemon)."""
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return conn.pid
    raise AssertionError(f"nothing listens on port {port}")


def connects(endpoint: str) -> bool:
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return True
    except OSError:
        return False


def node(d: Daemon) -> dict[str, object]:
    r = httpx.get(d.url + "/llmman/node", timeout=10)
    r.raise_for_status()
    doc: dict[str, object] = r.json()
    return doc


def lend(d: Daemon, memory: int, owner: str = "front-node") -> httpx.Response:
    return httpx.post(d.url + WORKERS, json={"owner": owner, "model": "docker.io/ai/gemma3:270m",
                                              "memory": memory}, timeout=60)


def lending_daemon(tmp: Path, model_file: Path, lease: str = "60s", **env: str) -> Daemon:
    Store(tmp / "store").build(parse_reference(MODEL_NAME), model_file)
    return start_daemon(tmp, extra_env={"LLMMAN_RPC_SERVE": "true", "LLMMAN_RPC_LEASE": lease,
                                        "LLMMAN_MEMORY": str(CAPACITY), **env})


@pytest.fixture
def lender(tmp_path: Path, model_file: Path) -> Iterator[Daemon]:
    d = lending_daemon(tmp_path, model_file)
    try:
        yield d
    finally:
        d.stop()


def test_a_lease_starts_a_worker_that_listens_and_reserves(lender: Daemon) -> None:
    r = lend(lender, 300 * MIB)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["lease"] == 60.0 and body["memory"] == 300 * MIB
    assert connects(body["endpoint"])
    (worker,) = rpc_children(lender)
    assert worker.pid == worker_pid(int(body["endpoint"].rsplit(":", 1)[1]))
    assert "-c" in worker.cmdline()
    assert worker.environ()["LLAMA_CACHE"] == str(lender.store.parent / "rpc-cache")
    doc = node(lender)
    assert doc["rpc"] == {"serve": True, "reserved": 300 * MIB, "workers": 1}
    assert doc["free"] == CAPACITY - 300 * MIB and doc["loaded"] == {}
    log = lender.store.parent / "logs" / f"rpc-{body['id']}.log"
    wait_until(lambda: log.is_file() and "Accepted client connection" in log.read_text(), "the worker's log")
    assert httpx.delete(f"{lender.url}{WORKERS}/{body['id']}", timeout=30).json() == {"stopped": True}
    assert gone(worker.pid)
    assert node(lender)["rpc"] == {"serve": True, "reserved": 0, "workers": 0}


def test_the_reservation_refuses_a_load_and_evicts_an_idle_model(lender: Daemon) -> None:
    with lender.client() as c:
        r = c.post("/api/generate", json={"model": MODEL_NAME, "prompt": "Hi", "stream": False,
                                          "options": {"num_predict": 2}})
        assert r.status_code == 200, r.text
        loaded = node(lender)["loaded"]
        assert isinstance(loaded, dict)
        size = int(loaded[MODEL_REF])
        # the idle model goes to make room: what is left after the lease is a quarter of the model
        r = lend(lender, CAPACITY - size // 4)
        assert r.status_code == 201, r.text
        lent = r.json()
        assert node(lender)["loaded"] == {}
        assert c.get("/api/ps", headers={"x-llmman-hop": "1"}).json()["models"] == []
        r = c.post("/api/generate", json={"model": MODEL_NAME, "prompt": "Hi", "stream": False})
        assert r.status_code == 500, r.text
        assert "lent to RPC workers" in r.json()["error"]
        assert httpx.delete(f"{lender.url}{WORKERS}/{lent['id']}", timeout=30).json() == {"stopped": True}
        r = c.post("/api/generate", json={"model": MODEL_NAME, "prompt": "Hi", "stream": False,
                                          "options": {"num_predict": 2}})
        assert r.status_code == 200, r.text  # the memory is back once the worker is stopped


def test_an_expired_lease_stops_the_worker(tmp_path: Path, model_file: Path) -> None:
    d = lending_daemon(tmp_path, model_file, lease="1s")
    try:
        r = lend(d, 100 * MIB)
        assert r.status_code == 201, r.text
        pid = worker_pid(int(r.json()["endpoint"].rsplit(":", 1)[1]))
        wait_until(lambda: gone(pid), "the unrenewed worker to be stopped and reaped", timeout=30)
        wait_until(lambda: node(d)["rpc"] == {"serve": True, "reserved": 0, "workers": 0}, "its memory back")
        assert httpx.post(f"{d.url}{WORKERS}/{r.json()['id']}/renew", timeout=10).status_code == 404
        assert "was not renewed within 1 s" in d.log_text()
    finally:
        d.stop()


def test_a_killed_worker_answers_404_and_frees_its_memory(lender: Daemon) -> None:
    r = lend(lender, 200 * MIB)
    assert r.status_code == 201, r.text
    body = r.json()
    renew = f"{lender.url}{WORKERS}/{body['id']}/renew"
    assert httpx.post(renew, timeout=10).json() == {"lease": 60.0}
    pid = worker_pid(int(body["endpoint"].rsplit(":", 1)[1]))
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: gone(pid), "the killed worker to be reaped")
    wait_until(lambda: httpx.post(renew, timeout=10).status_code == 404, "renew to answer 404")
    assert httpx.post(renew, timeout=10).json()["error"].startswith("no RPC worker")
    assert node(lender)["rpc"] == {"serve": True, "reserved": 0, "workers": 0}
    assert httpx.get(lender.url + WORKERS, timeout=10).json()["workers"] == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_worker_outlives_its_daemon(tmp_path: Path, model_file: Path, sig: signal.Signals) -> None:
    d = lending_daemon(tmp_path, model_file)
    try:
        pids = []
        for _ in range(2):
            r = lend(d, 100 * MIB)
            assert r.status_code == 201, r.text
            pids.append(worker_pid(int(r.json()["endpoint"].rsplit(":", 1)[1])))
    finally:
        d.stop(sig)
    # SIGTERM: the daemon stops them itself; SIGKILL: the kernel kills them with it (runner.orphans). Either
    # way the parent (the daemon, or init once it is gone) reaps them.
    wait_until(lambda: all(gone(pid) for pid in pids), f"no ggml-rpc-server left after {sig.name}")


def test_serve_off_refuses(tmp_path: Path, model_file: Path) -> None:
    d = start_daemon(tmp_path)
    try:
        r = lend(d, 100 * MIB)
        assert r.status_code == 403 and "rpc.serve" in r.json()["error"]
        assert node(d)["rpc"] == {"serve": False, "reserved": 0, "workers": 0}
        assert rpc_children(d) == []
    finally:
        d.stop()


@pytest.fixture
def gemma_file(model_file: Path) -> Path:
    path = Path(os.environ.get("LLMMAN_TEST_GEMMA") or model_file.parent / "gemma-3-270m-q4_k_m.gguf")
    if not path.is_file():
        pytest.skip("Gemma 3 270M missing: run scripts/setup.sh --test")
    return path


def test_llama_server_puts_layers_on_a_lent_worker(lender: Daemon, gemma_file: Path, tmp_path: Path) -> None:
    r = lend(lender, 512 * MIB)
    assert r.status_code == 201, r.text
    endpoint = r.json()["endpoint"]
    llama = _llama_server()
    assert llama is not None
    port = free_port()
    log = tmp_path / "llama-server.log"
    with log.open("wb") as out:
        child = subprocess.Popen([llama, "-m", str(gemma_file), "--rpc", endpoint, "-ngl", "99", "-c", "512",
                                  "--host", "127.0.0.1", "--port", str(port), "-np", "1",
                                  "--log-verbosity", "4"],  # the buffer-size lines
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def healthy() -> bool:
            assert child.poll() is None, log.read_text(errors="replace")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, "llama-server --rpc to load Gemma", timeout=180)
        text = log.read_text(errors="replace")
        buffers = [line for line in text.splitlines() if "RPC0" in line and "model buffer size" in line]
        assert buffers, text  # the weights went to the worker
        r = httpx.post(f"http://127.0.0.1:{port}/completion",
                       json={"prompt": "The capital of France is", "n_predict": 8, "temperature": 0},
                       timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["tokens_predicted"] > 0 and r.json()["content"].strip()
    finally:
        child.terminate()
        child.wait(timeout=30)
    wait_until(lambda: httpx.get(lender.url + WORKERS, timeout=10).json()["workers"][0]["alive"],
               "the worker to live on after its client left")
