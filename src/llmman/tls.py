"""TLS for llmman's own links: the daemon serving HTTPS, and the client side towards ``https://`` peers,
registries and daemons (the system trust store plus ``tls.ca_file``, ``LLMMAN_TLS_CA``).

The trust is the operating system's own. On macOS and Windows client contexts come from ``truststore``,
which verifies through the keychain or the Windows certificate store (OpenSSL there has no usable CA
paths of its own). On Linux and the BSDs the system store *is* OpenSSL's CA paths, which is all
``truststore`` would use there too, except that it reloads the whole bundle on every handshake (about
130 ms against 8 ms, measured): the stdlib context loads it once. ``truststore`` is imported only when a
context is built (the CLI builds one only for an ``https://`` daemon), so ``llmman ps`` stays fast.
"""

from __future__ import annotations

import ssl
import sys

from llmman.errors import ConfigError

NATIVE_TRUST = sys.platform in ("darwin", "win32")  # verify through the OS's own store (truststore)


def client_context(ca_file: str = "", *, native: bool = NATIVE_TRUST) -> ssl.SSLContext:
    """A verifying client context (certificate and host name checked): the system trust store plus
    the PEM bundle ``ca_file`` when set.

    Args:
        ca_file: an extra PEM CA bundle (``tls.ca_file``); empty = none.
        native: verify through ``truststore`` (the default on macOS and Windows; tests force it).

    Raises:
        ConfigError: ``ca_file`` cannot be read or holds no usable certificate.
    """
    ctx: ssl.SSLContext
    if native:
        import truststore

        ctx = truststore.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    else:
        ctx = ssl.create_default_context()
    if ca_file:
        trust_ca(ctx, ca_file)
    return ctx


def trust_ca(ctx: ssl.SSLContext, ca_file: str) -> None:
    """Make ``ctx`` trust the PEM bundle ``ca_file`` as well.

    Raises:
        ConfigError: ``ca_file`` cannot be read or holds no usable certificate.
    """
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"LLMMAN_TLS_CA={ca_file}: cannot load CA certificates: {exc}") from exc


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
