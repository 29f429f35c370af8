"""The daemon's TLS settings must agree (llmman.tls.check_server_tls), a bad CA file is named, and client
contexts (truststore's or the stdlib's) trust the system store plus the configured CA file."""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmman.errors import ConfigError
from llmman.tls import NATIVE_TRUST, check_server_tls, client_context, trust_ca


@pytest.mark.parametrize(("scheme", "cert", "key", "needle"), [
    ("https", "/c.pem", "", "go together"),
    ("http", "", "/k.pem", "go together"),
    ("http", "/c.pem", "/k.pem", "not https://"),
    ("https", "", "", "no certificate"),
    ("https", "/nonexistent/c.pem", "/nonexistent/k.pem", "LLMMAN_TLS_CERT=/nonexistent/c.pem"),
])
def test_inconsistent_tls_settings_are_refused(scheme: str, cert: str, key: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        check_server_tls(scheme, cert, key)


def test_plain_http_without_files_serves_plain() -> None:
    assert check_server_tls("http", "", "") is False


def test_unreadable_ca_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="LLMMAN_TLS_CA="):
        client_context(str(bad))
    assert client_context("").verify_mode.name == "CERT_REQUIRED"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """A TLS server on 127.0.0.1 whose certificate a private CA signed: ``(port, ca.pem)``."""
    tmp = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
             "-subj", "/CN=llmman test CA", "-keyout", "ca.key", "-out", "ca.pem", cwd=tmp)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=node",
             "-keyout", "node.key", "-out", "node.csr", cwd=tmp)
    (tmp / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", "ext.cnf", "-out", "node.pem", cwd=tmp)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp / "node.pem", tmp / "node.key")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)  # so that the thread sees ``stop``
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(10)
            with contextlib.suppress(OSError), server.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"hello")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], tmp / "ca.pem"
    stop.set()
    thread.join(timeout=5)
    listener.close()


def _hello(ctx: ssl.SSLContext, port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.recv(5)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
@pytest.mark.parametrize("native", [True, False], ids=["truststore", "stdlib"])
def test_client_context_trusts_the_system_store_plus_the_ca_file(tls_server: tuple[int, Path],
                                                                 native: bool) -> None:
    port, ca = tls_server
    ctx = client_context(str(ca), native=native)
    assert (ctx.verify_mode, ctx.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert _hello(ctx, port) == b"hello"
    with pytest.raises(ssl.SSLCertVerificationError):  # the system store alone does not know the CA
        _hello(client_context("", native=native), port)
    later = client_context("", native=native)
    trust_ca(later, str(ca))  # a CA added to a built context (a peer's registry client) counts as well
    assert _hello(later, port) == b"hello"


def test_native_trust_is_truststore_where_the_os_has_its_own_store() -> None:
    import truststore

    assert isinstance(client_context("", native=True), truststore.SSLContext)
    assert NATIVE_TRUST is (sys.platform in ("darwin", "win32"))
