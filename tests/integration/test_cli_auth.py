"""The CLI presents ``LLMMAN_API_KEY`` (or the first of ``LLMMAN_API_KEYS``) to a daemon that wants keys."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.daemons import Daemon, start_daemon

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("keyed"), extra_env={"LLMMAN_API_KEYS": "sesame,other"})
    yield d
    d.stop(signal.SIGTERM)


def _ps(d: Daemon, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    run_env = {k: v for k, v in d.env.items() if k not in ("LLMMAN_API_KEYS", "LLMMAN_API_KEY")}
    run_env.update(env)
    return subprocess.run([sys.executable, "-m", "llmman", "ps"], env=run_env, cwd=tmp,
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_without_a_key_gets_the_401_message(keyed: Daemon, tmp_path: Path) -> None:
    done = _ps(keyed, tmp_path)
    assert done.returncode == 1
    assert "API key" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("env", [{"LLMMAN_API_KEY": "other"}, {"LLMMAN_API_KEYS": "sesame"}])
def test_cli_with_a_key_lists_loaded_models(keyed: Daemon, tmp_path: Path, env: dict[str, str]) -> None:
    done = _ps(keyed, tmp_path, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:3] == ["NAME", "ID", "SIZE"]


def test_cli_with_a_wrong_key_is_refused(keyed: Daemon, tmp_path: Path) -> None:
    done = _ps(keyed, tmp_path, LLMMAN_API_KEY="wrong")
    assert done.returncode == 1 and "API key" in done.stderr
