"""The daemon's TLS settings must agree (llmman.tls.check_server_tls) and a bad CA file is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmman.errors import ConfigError
from llmman.tls import check_server_tls, client_context


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
