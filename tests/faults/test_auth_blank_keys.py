"""Fault catalogue: blank API keys (issue 13 item 4), against a real ``llmman serve``.

Before: ``LLMMAN_API_KEYS=","`` parsed as no keys at all, so a daemon on ``0.0.0.0`` with ``LLMMAN_AUTH=off``
(or on loopback) served anyone while its operator believed keys were set. Now every blank spelling is a
configuration error at start, naming the variable, whatever the host and ``LLMMAN_AUTH``; the daemon never
binds. Keys that are all there still start it, and off loopback no keys at all is still refused.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from llmman.config.settings import load_settings
from llmman.errors import ConfigError
from tests.integration.daemons import free_port, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BLANK = [",", " ", ", ,", "  ,  ", "good,,key", "good, ", " ,good", "\t"]


def _serve(tmp: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``llmman serve`` to its exit: (code, output, url it would have listened on)."""
    home = tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    full = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / "d"),
            "LLMMAN_MODELS": str(tmp / "store"), "LLMMAN_OFFLINE": "1", "PATH": "/usr/bin:/bin",
            "LLMMAN_HOST": f"127.0.0.1:{port}", **env}
    if env.get("LLMMAN_HOST", "").startswith("0.0.0.0"):
        full["LLMMAN_HOST"] = f"0.0.0.0:{port}"
    done = subprocess.run([sys.executable, "-m", "llmman", "serve"], env=full, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, cwd=tmp)
    return done.returncode, done.stdout + done.stderr, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("keys", BLANK, ids=repr)
@pytest.mark.parametrize("where", [{}, {"LLMMAN_HOST": "0.0.0.0"},
                                   {"LLMMAN_HOST": "0.0.0.0", "LLMMAN_AUTH": "off"}],
                         ids=["loopback", "wildcard", "wildcard-auth-off"])
def test_blank_keys_are_a_configuration_error(tmp_path: Path, keys: str, where: dict[str, str]) -> None:
    code, output, url = _serve(tmp_path, {"LLMMAN_API_KEYS": keys, **where})
    assert code != 0, output
    assert "LLMMAN_API_KEYS" in output and "empty or blank" in output, output
    assert "Traceback" not in output, output
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/api/version", timeout=1.0)


@pytest.mark.parametrize("keys", BLANK, ids=repr)
def test_blank_keys_in_the_config_file_name_the_setting(tmp_path: Path, keys: str) -> None:
    conf = tmp_path / "llmman.conf"
    conf.write_text(f'[auth]\napi_keys = "{keys}"\n'.replace("\t", "\\t"))
    with pytest.raises(ConfigError, match=r"auth\.api_keys.*empty or blank"):
        load_settings(env={}, system_file=tmp_path / "none.conf", user_file=conf)


def test_no_keys_off_loopback_is_still_refused(tmp_path: Path) -> None:
    code, output, _ = _serve(tmp_path, {"LLMMAN_HOST": "0.0.0.0"})
    assert code != 0 and "without API keys" in output, output


def test_real_keys_still_serve_and_are_enforced(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, extra_env={"LLMMAN_API_KEYS": "k1, k2"})
    try:
        def status(headers: dict[str, str]) -> int:
            return httpx.get(d.url + "/api/tags", headers=headers, timeout=10).status_code

        assert status({}) == 401
        assert status({"Authorization": "Bearer k2"}) == 200
        assert status({"Authorization": "Bearer"}) == 401
        assert status({"x-api-key": "k3"}) == 401
    finally:
        d.stop()
