"""TLS in an aggregation: daemons serving HTTPS with certificates from a private CA the test makes
(``openssl``), ``https://`` peers trusted through ``LLMMAN_TLS_CA`` for probes, forwards and copies, and
the CLI reaching an ``https://`` daemon. llama-server is the fake; ``tiny`` is a 24 KB GGUF.
"""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import Daemon, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")]

TINY = "docker.io/ai/tiny:latest"
HOP = {"x-llmman-hop": "1"}


@dataclass
class Pki:
    ca: Path
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(tmp: Path) -> Pki:
    """A CA and one server certificate for 127.0.0.1-3 signed by it (EC P-256, one day)."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
             "-subj", "/CN=llmman test CA", "-keyout", "ca.key", "-out", "ca.pem", cwd=tmp)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=node",
             "-keyout", "node.key", "-out", "node.csr", cwd=tmp)
    (tmp / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3\n")
    _openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", "ext.cnf", "-out", "node.pem", cwd=tmp)
    return Pki(tmp / "ca.pem", tmp / "node.pem", tmp / "node.key")


def tls_daemon(tmp: Path, pki: Pki, host: str, names: tuple[str, ...], env: dict[str, str]) -> Daemon:
    make_store(tmp, names)
    (tmp / "bin").mkdir()
    binary = make_fake_binary(tmp / "bin")
    return start_daemon(tmp, host=host, extra_env={
        "LLMMAN_LLAMA_SERVER": str(binary), "LLMMAN_TLS_CERT": str(pki.cert), "LLMMAN_TLS_KEY": str(pki.key),
        "LLMMAN_TLS_CA": str(pki.ca), "LLMMAN_API_KEYS": "pool-key", "LLMMAN_DEBUG": "1", **env})


@dataclass
class Pair:
    pki: Pki
    a: Daemon  # names b; 4 GB
    b: Daemon  # stores tiny; 10 kB cap, so it cannot load tiny itself


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    b = tls_daemon(tmp_path_factory.mktemp("b"), pki, "127.0.0.3", ("tiny",), {"LLMMAN_MEMORY": "10kB"})
    try:
        a = tls_daemon(tmp_path_factory.mktemp("a"), pki, "127.0.0.2", (),
                       {"LLMMAN_MEMORY": "4GB", "LLMMAN_PEERS": b.url})
    except BaseException:
        b.stop()
        raise
    yield Pair(pki, a, b)
    a.stop(signal.SIGTERM)
    b.stop(signal.SIGTERM)


def _client(d: Daemon, pki: Pki) -> httpx.Client:
    return httpx.Client(base_url=d.url, verify=ssl.create_default_context(cafile=str(pki.ca)), timeout=60,
                        headers={"Authorization": "Bearer pool-key"})


def test_https_peer_is_probed_and_copied_from(pair: Pair) -> None:
    assert pair.a.url.startswith("https://") and pair.b.url.startswith("https://")
    with _client(pair.a, pair.pki) as c:
        r = c.post("/api/chat", json={"model": "tiny", "stream": False,
                                      "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        assert r.json()["message"]["content"]
        # b stores tiny but has no room, so a (most room) served it after copying it over https
        assert len(pair.a.children()) == 1 and not pair.b.children()
        assert f"copying {TINY} from peer 127.0.0.3" in pair.a.log_text()
        names = {(m["name"], m.get("node")) for m in c.get("/api/tags").json()["models"]}
        assert any(n == TINY for n, _ in names)


def test_plain_http_to_a_tls_daemon_fails(pair: Pair) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(pair.a.url.replace("https://", "http://") + "/api/version", timeout=5)
    with pytest.raises(httpx.ConnectError):  # the system CAs alone do not trust the private CA
        httpx.get(pair.a.url + "/api/version", timeout=5)


def _cli(pair: Pair, *args: str, ca: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_"))}
    env.update(HOME=str(pair.a.home), LLMMAN_HOST=pair.a.url, LLMMAN_API_KEY="pool-key",
               XDG_CONFIG_HOME=str(pair.a.home / ".config"))
    if ca:
        env["LLMMAN_TLS_CA"] = str(pair.pki.ca)
    return subprocess.run([sys.executable, "-m", "llmman", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_cli_reaches_an_https_daemon_with_the_ca(pair: Pair) -> None:
    ok = _cli(pair, "ps", ca=True)
    assert ok.returncode == 0, ok.stderr
    assert "NAME" in ok.stdout
    refused = _cli(pair, "ps", ca=False)
    assert refused.returncode != 0
    assert "certificate verify failed" in refused.stderr and "LLMMAN_TLS_CA" in refused.stderr, refused.stderr
    listed = _cli(pair, "list", ca=False)  # a daemon that answers is never replaced by the local store
    assert listed.returncode != 0 and "LLMMAN_TLS_CA" in listed.stderr, listed.stdout + listed.stderr


@pytest.mark.parametrize(("env", "needle"), [
    ({"LLMMAN_TLS_CERT": "/x.pem"}, "go together"),
    ({"LLMMAN_HOST": "https://127.0.0.1:1"}, "no certificate"),
])
def test_half_tls_configuration_is_refused(tmp_path: Path, env: dict[str, str], needle: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_"))}
    base.update(HOME=str(tmp_path), LLMMAN_MODELS=str(tmp_path / "store"), **env)
    r = subprocess.run([sys.executable, "-m", "llmman", "serve"], env=base, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert needle in r.stderr, r.stderr
