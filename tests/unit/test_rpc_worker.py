"""One real ``ggml-rpc-server`` (llmman.runner.rpc_worker.RpcWorker): its command line, ready once its port
accepts, its log file, a stop, a death on its own, a taken port, and finding the binary next to
llama-server (llmman.runner.binary.find_rpc_server)."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path

import psutil
import pytest

from llmman.errors import RunnerError
from llmman.runner.binary import find_llama_server, find_rpc_server
from llmman.runner.rpc_worker import RpcWorker, endpoint, rpc_argv, rpc_env


def rpc_binary() -> str:
    """The ggml-rpc-server beside the llama-server llmman would use; the test is skipped without one."""
    try:
        return find_rpc_server(find_llama_server("", path_env=os.environ.get("PATH", "")))
    except RunnerError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have ggml-rpc-server: {exc}")
        pytest.skip(str(exc))


def gone(pid: int) -> bool:
    """True when ``pid`` no longer exists: exited and reaped (a zombie still exists)."""
    try:
        psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return True
    return False


async def accepts(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


def make_worker(tmp_path: Path, **kwargs: object) -> RpcWorker:
    options: dict[str, object] = {"host": "127.0.0.1", "threads": 1, "cache": True,
                                  "env": rpc_env({"PATH": os.environ.get("PATH", "")}, tmp_path / "cache"),
                                  "log_path": tmp_path / "logs" / "rpc-test.log"}
    options.update(kwargs)
    return RpcWorker(rpc_binary(), **options)  # type: ignore[arg-type]


def test_argv_and_env() -> None:
    assert rpc_argv("/b/ggml-rpc-server", host="10.0.0.2", port=50052, threads=8, cache=True) == [
        "/b/ggml-rpc-server", "-H", "10.0.0.2", "-p", "50052", "-t", "8", "-c"]
    assert rpc_argv("r", host="h", port=1, threads=0, cache=False) == ["r", "-H", "h", "-p", "1", "-t", "1"]
    assert rpc_argv("r", host="h", port=1, threads=2, cache=False, stdbuf="/usr/bin/stdbuf")[:4] == [
        "/usr/bin/stdbuf", "-oL", "-eL", "r"]
    assert rpc_env({"A": "1", "LLAMA_CACHE": "/elsewhere"}, Path("/d/rpc-cache")) == {
        "A": "1", "LLAMA_CACHE": "/d/rpc-cache"}
    assert endpoint("::1", 5) == "[::1]:5"
    assert endpoint("10.0.0.2", 5) == "10.0.0.2:5"


async def test_ready_once_its_port_accepts_then_stopped(tmp_path: Path) -> None:
    worker = make_worker(tmp_path)
    await worker.start()
    assert worker.ready.is_set() and worker.alive and worker.port is not None and worker.pid is not None
    assert await accepts("127.0.0.1", worker.port)
    cmdline = psutil.Process(worker.pid).cmdline()  # stdbuf execs the server: same pid
    assert cmdline[0] == worker.binary
    assert cmdline[1:] == ["-H", "127.0.0.1", "-p", str(worker.port), "-t", "1", "-c"]
    assert psutil.Process(worker.pid).environ()["LLAMA_CACHE"] == str(tmp_path / "cache")
    # its own lines arrive as it prints them (stdbuf -oL), not at its exit: the kernel queues a connection
    # as soon as the port listens, the server logs it once it has accepted it
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not any("Accepted client connection" in line for line in worker.log_tail(50)):
        assert loop.time() < deadline, worker.log_tail(50)
        await asyncio.sleep(0.02)
    pid = worker.pid
    await worker.stop()
    assert worker.exited.is_set() and not worker.alive
    assert gone(pid)
    text = (tmp_path / "logs" / "rpc-test.log").read_text()
    assert "Accepted client connection" in text and "Starting RPC server" in text
    assert "starting: " in text and "stopped, exit code" in text


async def test_a_death_on_its_own_is_reported(tmp_path: Path) -> None:
    exits: list[RpcWorker] = []
    worker = make_worker(tmp_path, on_exit=exits.append)
    await worker.start()
    assert worker.pid is not None
    os.kill(worker.pid, 9)
    await asyncio.wait_for(worker.exited.wait(), 10)
    assert exits == [worker] and not worker.alive and worker.returncode == -9


async def test_a_stop_calls_no_on_exit_and_is_idempotent(tmp_path: Path) -> None:
    exits: list[RpcWorker] = []
    worker = make_worker(tmp_path, on_exit=exits.append)
    await worker.start()
    await asyncio.gather(worker.stop(), worker.stop())
    await worker.stop()
    assert exits == [] and worker.exited.is_set()


async def test_a_taken_fixed_port_fails_with_the_servers_words(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: the server cannot bind it, nothing accepts
        port = taken.getsockname()[1]
        worker = make_worker(tmp_path, port=port)
        with pytest.raises(RunnerError) as caught:
            await worker.start()
    assert worker.exited.is_set() and not worker.ready.is_set()
    assert "Failed to create server socket" in caught.value.message
    assert f"127.0.0.1:{port}" in caught.value.message


async def test_stopped_while_starting(tmp_path: Path) -> None:
    worker = make_worker(tmp_path)
    start = asyncio.create_task(worker.start())
    await worker.stop()
    with pytest.raises(RunnerError):
        await start
    assert worker.exited.is_set() and not worker.alive


def test_find_rpc_server_next_to_llama_server(tmp_path: Path) -> None:
    llama = tmp_path / "bin" / "llama-server"
    llama.parent.mkdir()
    llama.write_text("#!/bin/sh\n")
    with pytest.raises(RunnerError) as caught:
        find_rpc_server(str(llama))
    assert caught.value.status == 503 and caught.value.code == "rpc_server_not_found"
    assert str(llama.parent) in caught.value.message
    rpc = tmp_path / "bin" / "ggml-rpc-server"
    rpc.write_text("#!/bin/sh\n")
    with pytest.raises(RunnerError):  # not executable
        find_rpc_server(str(llama))
    rpc.chmod(rpc.stat().st_mode | stat.S_IXUSR)
    assert find_rpc_server(str(llama)) == str(rpc)
    # through a link: the directory of the file it points to
    link = tmp_path / "llama-server"
    link.symlink_to(llama)
    assert find_rpc_server(str(link)) == str(rpc)
