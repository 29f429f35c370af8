"""A real OCI registry for tests: Debian's ``docker-registry`` (CNCF distribution 2.8) on a loopback port.

``start_registry(tmp)`` serves plain HTTP; ``start_registry(tmp, secure=True)`` adds htpasswd basic auth
(user ``tester``/``secret``) and TLS with a server certificate signed by a CA generated for the test
(``Registry.ca`` is its PEM, for ``LLMMAN_TLS_CA``).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llmman.refs import Reference
from llmman.store import Store
from llmman.store import mediatypes as mt
from tests.integration.daemons import free_port

USER, PASSWORD = "tester", "secret"


def gemma_file() -> Path:
    """Gemma 3 270M Q4_K_M (253 MB; ``scripts/setup.sh --test`` fetches it), or skip (fail under CI)."""
    path = Path.home() / ".cache/llmman/models/gemma-3-270m-q4_k_m.gguf"
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"CI must have {path}: run scripts/setup.sh --test")
        pytest.skip(f"{path} missing: run scripts/setup.sh --test")
    return path


def docker_artifact(store: Store, ref: Reference, gguf: Path) -> str:
    """Store ``gguf`` as a Docker Model Runner artifact (``application/vnd.docker.ai.gguf.v3``) named
    ``ref``; returns the manifest digest."""
    with gguf.open("rb") as f:
        layer = store.write_blob(f)
    config = json.dumps({"config": {"format": "gguf"}}).encode()
    config_digest = store.write_blob([config])
    manifest = {
        "schemaVersion": 2, "mediaType": mt.OCI_MANIFEST,
        "config": {"mediaType": mt.DOCKER_AI_CONFIG, "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": mt.DOCKER_AI_GGUF, "digest": layer, "size": gguf.stat().st_size}],
    }
    return store.put_manifest(ref, json.dumps(manifest).encode(), mt.OCI_MANIFEST).digest


def available() -> bool:
    """True when ``docker-registry`` (and, for the secure variant, ``htpasswd``/``openssl``) exist."""
    return all(shutil.which(b) for b in ("docker-registry", "htpasswd", "openssl"))


@dataclass
class Registry:
    process: subprocess.Popen[bytes]
    host: str  # 127.0.0.1:PORT
    root: Path
    ca: Path | None
    log: Path

    def blob_gets(self, repository: str, digest: str) -> int:
        """How many ``GET /v2/<repository>/blobs/<digest>`` the access log shows so far."""
        return self.log.read_text(errors="replace").count(f'"GET /v2/{repository}/blobs/{digest} ')

    def requests(self, method: str, path_prefix: str) -> list[str]:
        """The access-log lines of ``method`` requests whose path starts with ``path_prefix``."""
        needle = f'"{method} {path_prefix}'
        return [line for line in self.log.read_text(errors="replace").splitlines() if needle in line]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def _make_ca(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1/localhost; returns (ca.pem, cert.pem, key.pem)."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=llmman test CA",
        "-keyout", "ca.key", "-out", "ca.pem")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "key.pem",
        "-out", "srv.csr")
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "ext.cnf", "-out", "cert.pem")
    return folder / "ca.pem", folder / "cert.pem", folder / "key.pem"


def start_registry(tmp: Path, *, secure: bool = False, timeout: float = 30.0) -> Registry:
    """Start a registry storing under ``tmp/registry``; returns once ``/v2/`` answers."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = [
        "version: 0.1",
        "log:\n  level: warn",
        f"storage:\n  filesystem:\n    rootdirectory: {tmp / 'registry'}\n  delete:\n    enabled: true",
        f"http:\n  addr: 127.0.0.1:{port}",
    ]
    ca = None
    if secure:
        ca, cert, key = _make_ca(tmp)
        subprocess.run(["htpasswd", "-Bbc", str(tmp / "htpasswd"), USER, PASSWORD], check=True,
                       capture_output=True)
        config[-1] += f"\n  tls:\n    certificate: {cert}\n    key: {key}"
        config.append(f"auth:\n  htpasswd:\n    realm: test\n    path: {tmp / 'htpasswd'}")
    (tmp / "config.yml").write_text("\n".join(config) + "\n")
    log = tmp / "registry.log"
    with log.open("ab") as out:
        process = subprocess.Popen(["docker-registry", "serve", str(tmp / "config.yml")], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    reg = Registry(process, f"127.0.0.1:{port}", tmp / "registry", ca, log)
    url = f"{'https' if secure else 'http'}://127.0.0.1:{port}/v2/"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"docker-registry exited:\n{log.read_text()}")
        try:
            httpx.get(url, verify=ssl.create_default_context(cafile=str(ca)) if ca else True, timeout=1.0)
            return reg
        except httpx.TransportError:
            time.sleep(0.05)  # readiness poll of a subprocess; the event is the port answering
    reg.stop()
    raise RuntimeError(f"docker-registry did not answer:\n{log.read_text()}")
