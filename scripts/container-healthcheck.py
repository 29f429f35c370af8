"""The container's HEALTHCHECK: exit 0 when the daemon this environment configures answers ``GET /health``
with 200, else 1 with one line on stderr saying why.

It reads the settings exactly as ``llmman serve`` does (``LLMMAN_HOST``, ``/etc/llmman/llmman.conf``, the
user file), so a changed port or HTTPS is followed; a wildcard bind (``0.0.0.0``) is asked on loopback.
``/health`` needs no API key. Over HTTPS the certificate is not verified: the check sends nothing secret and
only asks whether this daemon is up, and a certificate made for the machine's public name does not name
``127.0.0.1``. Slim images have no curl; this needs only the image's Python and llmman.
"""

from __future__ import annotations

import http.client
import ssl
import sys
from urllib.parse import urlsplit

from llmman.config.settings import load_settings
from llmman.errors import LlmmanError

TIMEOUT = 5.0  # seconds to connect and to answer; the Containerfile's --timeout is above it


def check() -> str | None:
    """None when ``GET /health`` answers 200, else why not."""
    try:
        settings = load_settings()
    except LlmmanError as exc:
        return f"configuration: {exc}"
    url = settings.host.client_url()
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, parts.port or 443, timeout=TIMEOUT, context=context)
    else:
        conn = http.client.HTTPConnection(host, parts.port or 80, timeout=TIMEOUT)
    try:
        conn.request("GET", "/health")
        answer = conn.getresponse()
        body = answer.read(200).decode(errors="replace").strip()
    except (OSError, http.client.HTTPException) as exc:
        return f"{url}/health: {exc}"
    finally:
        conn.close()
    if answer.status != 200:
        return f"{url}/health answered {answer.status}: {body}"
    return None


def main() -> int:
    """Run :func:`check`; 0 when healthy, 1 otherwise (Docker's and Podman's HEALTHCHECK convention)."""
    problem = check()
    if problem is None:
        return 0
    print(f"unhealthy: {problem}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
