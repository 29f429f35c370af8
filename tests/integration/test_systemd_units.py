"""The rendered units pass Debian's ``systemd-analyze verify`` (scripts/setup.sh --test installs systemd for
it), system and user, with ``ExecStart=`` naming the test venv's real ``llmman`` (verify checks that it is
an executable). ``verify`` exits 0 on an unknown key or a bad value and only warns, so a unit passes only
when it says nothing at all; the last test shows a typo fails that check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmman.cli.units import UNIT_NAME, render

ANALYZE = shutil.which("systemd-analyze")
LLMMAN = str(Path(sys.executable).parent / "llmman")

pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is missing: scripts/setup.sh --test "
                                "installs Debian's systemd package")


def verify(text: str, tmp_path: Path, *, user: bool) -> tuple[int, str]:
    """``systemd-analyze [--user] verify`` on ``text`` saved as llmman.service: its status and output."""
    folder = tmp_path / ("user" if user else "system")
    folder.mkdir(exist_ok=True)
    (folder / UNIT_NAME).write_text(text)
    runtime = tmp_path / "runtime"  # a user manager's $XDG_RUNTIME_DIR (verify starts one, offline)
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "SYSTEMD_"))}
    env.update(XDG_RUNTIME_DIR=str(runtime), SYSTEMD_LOG_COLOR="0", SYSTEMD_PAGER="")
    assert ANALYZE is not None
    done = subprocess.run([ANALYZE, *(["--user"] if user else []), "verify", f"./{UNIT_NAME}"],
                          cwd=folder, capture_output=True, text=True, env=env, timeout=120)
    return done.returncode, (done.stdout + done.stderr).strip()


@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_rendered_unit_verifies(tmp_path: Path, user: bool) -> None:
    assert os.access(LLMMAN, os.X_OK)
    status, output = verify(render(LLMMAN, user=user), tmp_path, user=user)
    assert (status, output) == (0, "")


@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_the_installed_unit_verifies(tmp_path: Path, user: bool) -> None:
    """What ``llmman install-service`` writes (run as the venv's command) passes too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMMAN_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    argv = [LLMMAN, "install-service", "--print", *(["--user"] if user else [])]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"ExecStart={LLMMAN} serve\n" in done.stdout
    assert verify(done.stdout, tmp_path, user=user) == (0, "")


@pytest.mark.parametrize(("change", "said"), [
    (("ProtectHome=yes", "ProtectHome=bogus"), "bogus"),
    (("KillMode=mixed", "KillMode=mixed\nWatchdogSecs=30s"), "WatchdogSecs"),
    ((f"ExecStart={LLMMAN}", "ExecStart=/nonexistent/llmman"), "/nonexistent/llmman"),
])
def test_a_broken_unit_fails_the_check(tmp_path: Path, change: tuple[str, str], said: str) -> None:
    text = render(LLMMAN, user=False)
    assert change[0] in text
    status, output = verify(text.replace(*change), tmp_path, user=False)
    assert (status, output) != (0, "")
    assert said in output
