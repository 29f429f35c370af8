"""llmman.cli.units and ``llmman install-service``: the one generator of the system and user units, the
files in ``deploy/systemd/`` it made, and the verb that writes a unit where systemd looks."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from llmman.cli.commands_service import in_a_home, this_llmman
from llmman.cli.main import main
from llmman.cli.units import DEFAULT_GRACE, UNIT_NAME, WATCHDOG_SEC, render, stop_timeout
from llmman.config.table import SETTINGS
from llmman.durations import parse_duration

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "systemd"
SHIPPED = "/usr/local/bin/llmman"


def parse_unit(text: str) -> dict[tuple[str, str], list[str]]:
    """``(section, key) -> values`` of a unit file, in order (a key may repeat: ``Environment=``)."""
    out: dict[tuple[str, str], list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault((section, key), []).append(value)
    return out


def one(unit: dict[tuple[str, str], list[str]], section: str, key: str) -> str:
    values = unit[(section, key)]
    assert len(values) == 1, (key, values)
    return values[0]


@pytest.mark.parametrize(("user", "path"), [(False, "system/llmman.service"), (True, "user/llmman.service")])
def test_deploy_files_are_the_generators_output(user: bool, path: str) -> None:
    """deploy/systemd/ is render()'s output for /usr/local/bin/llmman and the default grace; to refresh:
    ``llmman install-service [--user] --print --executable /usr/local/bin/llmman > deploy/systemd/...``."""
    assert (DEPLOY / path).read_text() == render(SHIPPED, user=user, grace=DEFAULT_GRACE)


def test_default_grace_is_the_settings_default() -> None:
    spec = next(s for s in SETTINGS if s.key == "server.shutdown_grace")
    assert parse_duration(spec.default, what=spec.key) == DEFAULT_GRACE


def test_system_unit() -> None:
    unit = parse_unit(render(SHIPPED, user=False))
    s = "Service"
    assert one(unit, s, "Type") == "notify"
    assert one(unit, s, "NotifyAccess") == "main"
    assert one(unit, s, "ExecStart") == f"{SHIPPED} serve"
    assert one(unit, s, "WatchdogSec") == f"{WATCHDOG_SEC}s"
    assert one(unit, s, "Restart") == "on-failure"
    assert one(unit, s, "KillMode") == "mixed"
    assert int(one(unit, s, "TimeoutStopSec").removesuffix("s")) > DEFAULT_GRACE + 2 + 10
    assert one(unit, s, "DynamicUser") == "yes"
    assert one(unit, s, "User") == "llmman"
    assert one(unit, s, "StateDirectory") == "llmman"
    assert "LLMMAN_MODELS=%S/llmman/store" in unit[(s, "Environment")]
    for key, value in (("ProtectSystem", "strict"), ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                       ("NoNewPrivileges", "yes")):
        assert one(unit, s, key) == value
    assert set(one(unit, s, "SupplementaryGroups").split()) == {"video", "render"}
    for key in ("PrivateDevices", "ProtectClock", "DevicePolicy", "DeviceAllow", "MemoryDenyWriteExecute",
                "ProcSubset"):  # each would take the GPU (or its memory figures) away: the unit says why
        assert (s, key) not in unit
    assert one(unit, "Unit", "After") == "network-online.target"
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_user_unit() -> None:
    unit = parse_unit(render(SHIPPED, user=True))
    s = "Service"
    assert one(unit, s, "Type") == "notify"
    assert one(unit, s, "NotifyAccess") == "main"
    assert one(unit, s, "ExecStart") == f"{SHIPPED} serve"
    assert one(unit, s, "WatchdogSec") == f"{WATCHDOG_SEC}s"
    assert one(unit, s, "KillMode") == "mixed"
    assert one(unit, s, "Restart") == "on-failure"
    assert one(unit, s, "NoNewPrivileges") == "yes"
    # the user's own store and config, as `llmman serve` by hand: no user, state directory or store here
    for key in ("User", "DynamicUser", "StateDirectory", "Environment", "ProtectSystem", "PrivateTmp",
                "LimitNOFILE"):
        assert (s, key) not in unit
    assert one(unit, "Install", "WantedBy") == "default.target"


@pytest.mark.parametrize("grace", [0.0, 30.0, 31.5, 300.0, 10**9])
def test_stop_timeout_exceeds_the_shutdown(grace: float) -> None:
    """Above the grace, its 2 s cut margin and the children's 10 s stop (daemon._graceful_timeout)."""
    assert stop_timeout(grace) >= min(grace, 86400) + 2 + 10 + 1
    assert stop_timeout(grace) >= 90


def test_grace_reaches_the_unit() -> None:
    unit = parse_unit(render(SHIPPED, user=False, grace=600))
    assert one(unit, "Service", "TimeoutStopSec") == "660s"


@pytest.mark.parametrize("bad", ["llmman", "bin/llmman", "/opt/my tools/llmman", "/opt/100%/llmman",
                                 "/opt/$x/llmman"])
def test_render_refuses_paths_a_unit_cannot_carry(bad: str) -> None:
    with pytest.raises(ValueError):
        render(bad, user=False)


def test_in_a_home() -> None:
    assert in_a_home(["/usr/local/bin/llmman", "/root/.pyenv/bin/python3"]) == "/root/.pyenv/bin/python3"
    assert in_a_home(["/home/ann/.local/bin/llmman"]) == "/home/ann/.local/bin/llmman"
    assert in_a_home(["/opt/llmman/bin/llmman", "/usr/bin/python3.11", "/homely/x", "/tmpfoo/x"]) is None
    assert in_a_home(["/usr/bin/llmman", "/tmp/venv/bin/python"]) == "/tmp/venv/bin/python"
    assert in_a_home(["/var/tmp/x/llmman"]) == "/var/tmp/x/llmman"


def test_this_llmman_is_the_venvs_script() -> None:
    """Under pytest argv[0] is not llmman: the script beside this Python is."""
    assert this_llmman("") == str(Path(sys.executable).parent / "llmman")


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home


def _script(tmp_path: Path) -> str:
    """An executable outside any home directory, to stand for an installed llmman."""
    path = tmp_path / "bin" / "llmman"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_print_writes_nothing(config_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install-service", "--user", "--print"]) == 0
    assert capsys.readouterr().out == render(this_llmman(""), user=True)
    assert not config_home.exists()


def test_user_unit_written_where_systemd_looks(config_home: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    exe = _script(tmp_path)
    assert main(["install-service", "--user", "--executable", exe]) == 0
    path = config_home / "systemd" / "user" / UNIT_NAME
    assert path.read_text() == render(exe, user=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    out = capsys.readouterr().out
    assert f"wrote {path}" in out
    assert "systemctl --user daemon-reload && systemctl --user enable --now llmman.service" in out
    assert "loginctl enable-linger" in out

    assert main(["install-service", "--user", "--executable", exe]) == 0  # again: nothing to do
    assert "is up to date" in capsys.readouterr().out


def test_a_different_unit_is_replaced_only_with_force(config_home: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    exe = _script(tmp_path)
    path = config_home / "systemd" / "user" / UNIT_NAME
    path.parent.mkdir(parents=True)
    path.write_text("[Service]\nExecStart=/old/llmman serve\n")
    assert main(["install-service", "--user", "--executable", exe]) == 1
    assert "exists and differs" in capsys.readouterr().err
    assert path.read_text().startswith("[Service]")
    assert main(["install-service", "--user", "--executable", exe, "--force"]) == 0
    assert path.read_text() == render(exe, user=True)
    assert f"replaced {path}" in capsys.readouterr().out


def test_system_unit_to_a_unit_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exe = "/bin/true"  # an executable outside /home, /root and /tmp (tmp_path is in /tmp: hidden from it)
    target = tmp_path / "staging"
    assert main(["install-service", "--executable", exe, "--unit-dir", str(target)]) == 0
    assert (target / UNIT_NAME).read_text() == render(exe, user=False)
    out = capsys.readouterr().out
    assert f"systemd does not read {target}: copy {target / UNIT_NAME} to /etc/systemd/system/" in out
    assert "systemctl daemon-reload && systemctl enable --now llmman.service" in out
    assert "journalctl -u llmman" in out


def test_a_system_unit_refuses_an_llmman_in_tmp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """PrivateTmp=yes gives the service its own /tmp: an llmman installed there could not start."""
    exe = _script(tmp_path)
    assert exe.startswith("/tmp/")
    assert main(["install-service", "--executable", exe, "--unit-dir", str(tmp_path / "units")]) == 1
    assert "PrivateTmp=yes" in capsys.readouterr().err
    assert not (tmp_path / "units").exists()


def test_print_warns_of_what_writing_would_refuse(capsys: pytest.CaptureFixture[str]) -> None:
    """This test's Python lives in a home or /tmp on most machines; where it does not, nothing is said."""
    assert main(["install-service", "--print"]) == 0
    captured = capsys.readouterr()
    assert captured.out == render(this_llmman(""), user=False)
    hidden = in_a_home([this_llmman(""), os.path.realpath(this_llmman("")), os.path.realpath(sys.executable)])
    assert ("Warning:" in captured.err) == (hidden is not None)


def test_refuses_what_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nothing")
    assert main(["install-service", "--executable", missing, "--unit-dir", str(tmp_path)]) == 1
    assert "is not an executable file" in capsys.readouterr().err
    assert main(["install-service", "--executable", "relative/llmman", "--print"]) == 1
    assert "absolute path" in capsys.readouterr().err
    assert not (tmp_path / UNIT_NAME).exists()


def test_grace_from_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LLMMAN_SHUTDOWN_GRACE", "5m")
    assert main(["install-service", "--print", "--executable", SHIPPED]) == 0
    assert "TimeoutStopSec=360s" in capsys.readouterr().out


def test_the_verb_needs_no_daemon_module() -> None:
    """``install-service`` imports neither the daemon nor uvicorn (like every verb but ``serve``)."""
    import subprocess

    code = ("import sys; from llmman.cli.main import main; main(['install-service', '--print', "
            "'--executable', '/usr/local/bin/llmman']); "
            "assert 'llmman.daemon' not in sys.modules and 'uvicorn' not in sys.modules")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMMAN_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
