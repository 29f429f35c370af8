"""TLS for llmman's own links: the daemon serving HTTPS, and the client side towards ``https://`` peers
and daemons (the system CAs plus ``tls.ca_file``, ``LLMMAN_TLS_CA``). Stdlib only, so the CLI stays fast.
"""

from __future__ import annotations

import ssl

from llmman.errors import ConfigError


def client_context(ca_file: str = "") -> ssl.SSLContext:
    """A verifying client context: the system CAs plus the PEM bundle ``ca_file`` when set.

    Raises:
        ConfigError: ``ca_file`` cannot be read or holds no usable certificate.
    """
    ctx = ssl.create_default_context()
    if ca_file:
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"LLMMAN_TLS_CA={ca_file}: cannot load CA certificates: {exc}") from exc
    return ctx


def check_server_tls(scheme: str, cert_file: str, key_file: str) -> bool:
    """Whether the daemon serves HTTPS; the three settings must agree.

    Args:
        scheme: ``LLMMAN_HOST``'s scheme (``http`` or ``https``).
        cert_file: ``LLMMAN_TLS_CERT`` (empty = none).
        key_file: ``LLMMAN_TLS_KEY`` (empty = none).

    Raises:
        ConfigError: a certificate without its key or the reverse, TLS files with an ``http://`` host,
            or an ``https://`` host without them, or a file that is not a usable certificate/key pair.
    """
    if bool(cert_file) != bool(key_file):
        raise ConfigError("LLMMAN_TLS_CERT and LLMMAN_TLS_KEY go together: set both or neither")
    if cert_file and scheme != "https":
        raise ConfigError("LLMMAN_TLS_CERT is set but LLMMAN_HOST is not https://: write "
                          "LLMMAN_HOST=https://HOST:PORT so clients and peers know to use TLS")
    if not cert_file and scheme == "https":
        raise ConfigError("LLMMAN_HOST is https:// but no certificate is set: set LLMMAN_TLS_CERT and "
                          "LLMMAN_TLS_KEY")
    if cert_file:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"LLMMAN_TLS_CERT={cert_file}, LLMMAN_TLS_KEY={key_file}: {exc}") from exc
    return bool(cert_file)
