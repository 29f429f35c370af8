"""LlamaServerProcess against the fake llama-server: the state machine, faults, and cleanup."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from llmman.errors import LoadTimeout, RunnerError
from llmman.runner import LaunchSpec, LlamaServerProcess, RunnerState, build_argv, child_env
from llmman.runner import process as process_module
from llmman.runner.binary import free_port as real_free_port

pytestmark = pytest.mark.timeout(30)

_FAKE = Path(__file__).resolve().parents[1] / "fakes" / "fake_llama_server.py"
_spec = importlib.util.spec_from_file_location("fake_llama_server", _FAKE)
assert _spec is not None and _spec.loader is not None
fake_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_module)

Factory = Callable[..., LlamaServerProcess]


def state(proc: LlamaServerProcess) -> RunnerState:
    """The state, read through a call so mypy does not narrow it across awaits."""
    return proc.state


def assert_gone(pid: int) -> None:
    """Neither the child nor anything in its process group is alive."""
    assert not psutil.pid_exists(pid)
    for proc in psutil.process_iter():
        try:
            assert os.getpgid(proc.pid) != pid, f"process {proc.pid} survived in group {pid}"
        except (ProcessLookupError, psutil.Error):
            pass


async def get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.json(content_type=None)


@pytest.fixture
def occupied_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Factory]:
    """Build LlamaServerProcess objects running the fake; every one is stopped after the test."""
    binary = str(fake_module.make_launcher(tmp_path))
    made: list[LlamaServerProcess] = []

    def factory(fake_env: dict[str, str] | None = None, **kwargs: Any) -> LlamaServerProcess:
        parent = {**os.environ, **(fake_env or {})}
        kwargs.setdefault("env", child_env(parent, config_home=tmp_path / "config"))
        kwargs.setdefault("log_path", tmp_path / "logs" / "smol.log")
        kwargs.setdefault("stall_timeout", 20.0)
        spec = LaunchSpec(model_path=tmp_path / "smol.gguf", alias="smol:latest", n_ctx=512, n_parallel=2)
        proc = LlamaServerProcess(kwargs.pop("binary", binary), spec, **kwargs)
        made.append(proc)
        return proc

    yield factory
    for proc in made:
        await proc.stop(grace=1.0)


async def test_start_ready_health_then_stop(make: Factory) -> None:
    exits: list[LlamaServerProcess] = []
    proc = make(on_exit=exits.append)
    assert state(proc) is RunnerState.STOPPED
    await proc.start()
    assert state(proc) is RunnerState.READY
    assert proc.pid is not None and proc.port is not None
    assert proc.base_url == f"http://127.0.0.1:{proc.port}"
    assert proc.started_at is not None and proc.ready_at is not None and proc.ready_at >= proc.started_at
    assert await get(proc.base_url + "/health") == (200, {"status": "ok"})
    pid = proc.pid
    await proc.stop()
    assert state(proc) is RunnerState.STOPPED
    assert proc.returncode == 0  # the fake exits 0 on SIGTERM, like llama-server's graceful stop
    assert await proc.wait_exit() == 0
    assert proc.exited.is_set()
    assert exits == []  # a requested stop is not a crash
    assert_gone(pid)
    await proc.stop()  # idempotent
    assert state(proc) is RunnerState.STOPPED


async def test_argv_reaches_the_child(make: Factory, tmp_path: Path) -> None:
    proc = make()
    await proc.start()
    _, argv = await get(proc.base_url + "/fake/argv")
    assert proc.port is not None
    expected = build_argv("x", proc.spec, host="127.0.0.1", port=proc.port)[1:]
    assert argv == expected
    _, props = await get(proc.base_url + "/props")
    assert props["default_generation_settings"]["n_ctx"] == 512  # per slot, as asked
    assert props["total_slots"] == 2


async def test_exit_while_loading_fails_fast_with_its_lines(make: Factory) -> None:
    proc = make({"FAKE_EXIT_ON_LOAD": "3"}, stall_timeout=600.0)
    with pytest.raises(RunnerError) as caught:
        await proc.start()
    assert not isinstance(caught.value, LoadTimeout)
    message = str(caught.value)
    assert message.startswith(
        "llama-server exited with code 3 while loading (corrupt or unsupported model file): "
    )
    assert "error loading model: fake failure" in message
    assert "exiting due to model loading error" in message.splitlines()[-1]
    assert state(proc) is RunnerState.FAILED
    assert proc.returncode == 3
    assert proc.pid is not None
    assert_gone(proc.pid)


async def test_silent_child_hits_the_stall_timeout_and_is_killed(make: Factory) -> None:
    proc = make({"FAKE_SILENT_HANG": "1"}, stall_timeout=0.5)
    with pytest.raises(LoadTimeout, match=r"stall timeout 0\.5 s"):
        await proc.start()
    assert state(proc) is RunnerState.FAILED
    assert proc.returncode == -signal.SIGKILL
    assert proc.pid is not None
    assert_gone(proc.pid)
    assert proc.exited.is_set()


async def test_slow_loader_that_keeps_printing_is_not_killed(make: Factory) -> None:
    # Loading takes 2.5 s, far beyond the 1 s stall timeout, but a line comes every 0.1 s.
    proc = make({"FAKE_LOAD_DELAY": "2.5", "FAKE_LOAD_LOG_INTERVAL": "0.1"}, stall_timeout=1.0)
    await proc.start()
    assert state(proc) is RunnerState.READY
    progress = [line for line in proc.log_lines if "fake progress step" in line]
    assert len(progress) >= 10


async def test_kill_9_while_ready_calls_on_exit_at_once(make: Factory) -> None:
    died = asyncio.Event()
    seen: list[tuple[LlamaServerProcess, RunnerState]] = []

    def on_exit(p: LlamaServerProcess) -> None:
        seen.append((p, p.state))
        died.set()

    proc = make(on_exit=on_exit)
    await proc.start()
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    await died.wait()
    assert seen == [(proc, RunnerState.FAILED)]
    assert state(proc) is RunnerState.FAILED
    assert proc.returncode == -signal.SIGKILL
    assert proc.exited.is_set()
    await proc.stop()
    assert state(proc) is RunnerState.STOPPED
    assert len(seen) == 1


async def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(make: Factory) -> None:
    proc = make({"FAKE_IGNORE_SIGTERM": "1"})
    await proc.start()
    pid = proc.pid
    assert pid is not None
    await proc.stop(grace=0.3)
    assert state(proc) is RunnerState.STOPPED
    assert proc.returncode == -signal.SIGKILL
    assert_gone(pid)
    assert "SIGKILL" in proc.log_path.read_text()


async def test_environment_is_scrubbed(make: Factory, tmp_path: Path) -> None:
    dirty = {
        "LLAMA_ARG_CTX_SIZE": "1",
        "LLAMA_API_KEY": "k",
        "LLAMA_SERVER_ROUTER_PORT": "1",
        "LLAMA_SERVER_CHILD_MODE": "1",
        "CUDA_VISIBLE_DEVICES": "3",
    }
    proc = make(dirty)
    await proc.start()
    _, env = await get(proc.base_url + "/fake/env")
    assert not [name for name in env if name.startswith("LLAMA_")]
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["XDG_CONFIG_HOME"] == str(tmp_path / "config")


async def test_child_output_goes_to_log_file_and_ring(make: Factory, tmp_path: Path) -> None:
    proc = make(ring_lines=3)
    await proc.start()
    assert proc.port is not None
    assert proc.log_tail(1) == [f"srv  llama_server: listening on http://127.0.0.1:{proc.port}"]
    assert len(proc.log_lines) == 3
    await proc.stop()
    text = (tmp_path / "logs" / "smol.log").read_text()
    assert "main: model loaded" in text
    assert "srv    load_model: loading model" in text
    assert "cleaning up before exit" in text  # lines printed while stopping are kept too


async def test_cancelling_start_mid_load_leaves_no_child(make: Factory) -> None:
    proc = make({"FAKE_LOAD_DELAY": "60"})
    task = asyncio.create_task(proc.start())
    await proc.spawned.wait()
    pid = proc.pid
    assert pid is not None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert state(proc) is RunnerState.FAILED
    assert proc.exited.is_set()
    assert_gone(pid)


async def test_stop_during_start_fails_the_start(make: Factory) -> None:
    proc = make({"FAKE_LOAD_DELAY": "60"})
    task = asyncio.create_task(proc.start())
    await proc.spawned.wait()
    pid = proc.pid
    assert pid is not None
    await proc.stop()
    with pytest.raises(RunnerError, match="stopped while loading"):
        await task
    assert state(proc) is RunnerState.STOPPED
    assert_gone(pid)


async def test_taken_port_is_retried_once_on_another(
    make: Factory, occupied_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([occupied_port])
    monkeypatch.setattr(process_module, "free_port", lambda host: next(ports, None) or real_free_port(host))
    proc = make()
    await proc.start()
    assert state(proc) is RunnerState.READY
    assert proc.port != occupied_port
    assert "couldn't bind" in proc.log_path.read_text()


async def test_fixed_taken_port_fails(make: Factory, occupied_port: int) -> None:
    proc = make(port=occupied_port)
    with pytest.raises(RunnerError, match="couldn't bind"):
        await proc.start()
    assert state(proc) is RunnerState.FAILED


async def test_missing_binary_fails_cleanly(make: Factory, tmp_path: Path) -> None:
    proc = make(binary=str(tmp_path / "missing-llama-server"))
    with pytest.raises(RunnerError, match="cannot run llama-server"):
        await proc.start()
    assert state(proc) is RunnerState.FAILED
    with pytest.raises(RunnerError, match="never started"):
        await proc.wait_exit()


async def test_one_instance_starts_once(make: Factory) -> None:
    proc = make()
    await proc.start()
    with pytest.raises(RunnerError, match="already started"):
        await proc.start()
    assert state(proc) is RunnerState.READY


async def test_concurrent_stops_share_one_stop(make: Factory) -> None:
    proc = make({"FAKE_IGNORE_SIGTERM": "1"})
    await proc.start()
    await asyncio.gather(proc.stop(grace=0.2), proc.stop(grace=0.2), proc.stop())
    assert state(proc) is RunnerState.STOPPED
    assert proc.returncode == -signal.SIGKILL


async def test_stop_before_start_means_it_never_starts(make: Factory) -> None:
    proc = make()
    await proc.stop()
    with pytest.raises(RunnerError, match="stopped before it started"):
        await proc.start()
    assert state(proc) is RunnerState.STOPPED
    assert proc.pid is None
