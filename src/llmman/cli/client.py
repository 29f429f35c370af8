"""A small typed client of the daemon's HTTP API (the Ollama routes), used by the CLI.

It is built on the stdlib ``http.client`` rather than httpx: ``llmman ps`` must start fast, and httpx
costs ~100 ms to import plus ~40 ms to build a client (it loads the CA bundle) against ~25 ms for
``http.client``. One connection per request; ``https://`` daemons are verified against the system CAs plus
``tls.ca_file`` (``LLMMAN_TLS_CA``).
Management calls have a finite timeout; ``chat_stream`` has none once connected (a model may take
minutes to load and to answer). Errors come back as :class:`LlmmanError` carrying the daemon's
``{"error": "..."}`` text and HTTP status; when nothing answers at all the error is
:class:`DaemonUnreachable` (``could not connect to llmman serve at URL``).
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlsplit

from llmman.errors import LlmmanError, ModelNotFound, ServiceUnavailable

if TYPE_CHECKING:
    from llmman.config.settings import Settings

__all__ = ["DaemonClient", "DaemonTLSError", "DaemonUnreachable", "Upload"]

_TIMEOUT = 60.0
_CONNECT_TIMEOUT = 5.0
_PROBE_TIMEOUT = 2.0
_BLOCK = 1 << 20  # upload block size


class Upload:
    """A file's bytes for a request body, read in blocks, calling ``progress(bytes_so_far)`` after each
    (http.client reads a body with ``read``)."""

    def __init__(self, path: Path, progress: Callable[[int], None] | None = None) -> None:
        self.path = path
        self.size = path.stat().st_size
        self.sent = 0
        self._progress = progress
        self._file: BinaryIO | None = None

    def read(self, size: int = -1) -> bytes:
        """The next block ("" at the end); the file is opened on the first read and closed at its end."""
        if self._file is None:
            self._file = self.path.open("rb")
        block = self._file.read(size if size > 0 else _BLOCK)
        if not block:
            self._file.close()
            return b""
        self.sent += len(block)
        if self._progress is not None:
            self._progress(self.sent)
        return block


class DaemonUnreachable(ServiceUnavailable):
    """Nothing answered at the daemon's address (connection refused, unreachable, timed out)."""

    code = "daemon_unreachable"

    def __init__(self, url: str, hint: str | None = None) -> None:
        text = f"could not connect to llmman serve at {url}"
        super().__init__(f"{text} — {hint}" if hint else text)
        self.url = url


class DaemonTLSError(LlmmanError):
    """Something answers at the daemon's ``https://`` address, but the TLS handshake failed (an untrusted
    certificate, or no TLS there): never mistaken for "no daemon", so no command falls back to the local
    store or starts a second daemon."""

    code = "tls_failed"


def client_key(settings: Settings) -> str:
    """The key ``llmman`` commands present: ``auth.client_key`` (``LLMMAN_API_KEY``), else the first of
    the daemon's own ``auth.api_keys`` (so a CLI on the daemon's machine works without more set-up)."""
    if settings.client_key:
        return settings.client_key
    return next(iter(settings.api_key_list), "")


def client_for(settings: Settings, *, timeout: float = _TIMEOUT) -> DaemonClient:
    """A client of the daemon at ``settings.host`` presenting :func:`client_key`."""
    return DaemonClient(settings.host.client_url(), timeout=timeout, api_key=client_key(settings),
                        ca_file=settings.ca_file)


class DaemonClient:
    """Blocking client of one daemon at ``base_url`` (e.g. ``http://127.0.0.1:17434``)."""

    def __init__(self, base_url: str, *, timeout: float = _TIMEOUT, api_key: str = "",
                 ca_file: str = "") -> None:
        self.base_url = base_url.rstrip("/")
        self.ca_file = ca_file  # extra PEM CAs for an https:// daemon (tls.ca_file)
        self.timeout = timeout
        self.api_key = api_key
        parts = urlsplit(self.base_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)

    def close(self) -> None:
        """Nothing to release (one connection per request); kept for ``with`` blocks."""

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------------

    def _open(self, connect_timeout: float) -> http.client.HTTPConnection:
        """A connected connection. Raises :class:`DaemonUnreachable` when nothing accepts it."""
        conn: http.client.HTTPConnection
        if self._https:
            from llmman.tls import client_context

            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=connect_timeout, context=client_context(self.ca_file)
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=connect_timeout)
        try:
            conn.connect()
        except ssl.SSLError as exc:  # something answers, but the TLS handshake failed: say why
            conn.close()
            if isinstance(exc, ssl.SSLCertVerificationError):
                reason = f"certificate verify failed: {exc.verify_message}"
                hint = "trust the CA that signed its certificate with LLMMAN_TLS_CA=ca.pem"
            else:
                reason, hint = exc.reason or str(exc), "is it serving HTTPS?"
            message = f"TLS with llmman serve at {self.base_url} failed: {reason} — {hint}"
            raise DaemonTLSError(message) from exc
        except OSError as exc:
            conn.close()
            raise DaemonUnreachable(self.base_url) from exc
        return conn

    def _send(
        self, method: str, path: str, body: object, timeout: float | None, *, raw: Upload | None = None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Connect, send one request and read the status line; ``timeout`` None = wait forever. ``body`` is
        sent as JSON, or ``raw`` (a file's bytes, ``application/octet-stream``) instead."""
        connect_timeout = _CONNECT_TIMEOUT if timeout is None else min(timeout, _CONNECT_TIMEOUT)
        conn = self._open(connect_timeout)
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        headers = {"accept": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        data: bytes | Upload | None = None
        if raw is not None:
            data = raw
            conn.blocksize = _BLOCK
            headers["content-type"] = "application/octet-stream"
            headers["content-length"] = str(raw.size)
        elif body is not None:
            data = json.dumps(body).encode()
            headers["content-type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=headers)
            return conn, conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise LlmmanError(f"{method} {path}: {exc or type(exc).__name__}") from exc

    def _request(self, method: str, path: str, body: object = None, *, timeout: float | None = None) -> Any:
        """Send one request; return the decoded JSON body (None when empty). Non-2xx raises."""
        conn, response = self._send(method, path, body, self.timeout if timeout is None else timeout)
        try:
            content = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise LlmmanError(f"{method} {path}: {exc or type(exc).__name__}") from exc
        finally:
            conn.close()
        if response.status >= 400:
            raise _error_from(response.status, content)
        if not content.strip():
            return None
        try:
            return json.loads(content)
        except ValueError as exc:
            raise LlmmanError(f"{method} {path}: the daemon sent a body that is not JSON") from exc

    # -- the API ----------------------------------------------------------------------------------

    def version(self, *, timeout: float | None = None) -> str:
        """``GET /api/version`` -> the daemon's version string."""
        data = self._request("GET", "/api/version", timeout=timeout)
        return str((data or {}).get("version", ""))

    def ping(self) -> bool:
        """True when anything answers HTTP at the daemon's address within a short timeout (an error
        status counts as an answer: the daemon is there, it refused this request)."""
        try:
            conn, _ = self._send("GET", "/api/version", None, _PROBE_TIMEOUT)
        except DaemonTLSError:
            raise
        except LlmmanError:
            return False
        conn.close()
        return True

    def tags(self) -> list[dict[str, Any]]:
        """``GET /api/tags`` -> the stored models (Ollama shape)."""
        return list((self._request("GET", "/api/tags") or {}).get("models") or [])

    def ps(self) -> list[dict[str, Any]]:
        """``GET /api/ps`` -> the loaded models (Ollama shape plus ``started_at``/``processor``/``node``)."""
        return list((self._request("GET", "/api/ps") or {}).get("models") or [])

    def pool(self) -> dict[str, Any]:
        """``GET /llmman/pool`` -> ``{"nodes": [...]}``, this node and its peers (docs/aggregation.md)."""
        return dict(self._request("GET", "/llmman/pool") or {})

    def show(self, model: str, *, verbose: bool = False) -> dict[str, Any]:
        """``POST /api/show`` -> modelfile, parameters, template, details, model_info, capabilities."""
        body: dict[str, Any] = {"model": model}
        if verbose:
            body["verbose"] = True
        return dict(self._request("POST", "/api/show", body) or {})

    def delete(self, model: str) -> dict[str, Any]:
        """``DELETE /api/delete`` (unloads first); returns the response body, ``{}`` when empty."""
        return dict(self._request("DELETE", "/api/delete", {"model": model}, timeout=300.0) or {})

    def copy(self, source: str, destination: str) -> None:
        """``POST /api/copy``: tag ``source`` as ``destination``."""
        self._request("POST", "/api/copy", {"source": source, "destination": destination})

    def unload(self, model: str) -> dict[str, Any]:
        """``POST /api/generate {model, keep_alive: 0}`` without a prompt: unload ``model``."""
        return dict(self._request("POST", "/api/generate", {"model": model, "keep_alive": 0}) or {})

    def ndjson_stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST ``body`` to ``path`` and yield each NDJSON object (``/api/pull``, ``/api/push``); no timeout
        once connected. A non-2xx answer raises :class:`LlmmanError`; in-band errors are yielded."""
        conn, response = self._send("POST", path, body, None)
        try:
            if response.status >= 400:
                raise _error_from(response.status, response.read())
            while line := response.readline():
                try:
                    item = json.loads(line)
                except ValueError:
                    continue
                if isinstance(item, dict):
                    yield item
        except (OSError, http.client.HTTPException) as exc:
            raise LlmmanError(f"{path}: {exc or type(exc).__name__}") from exc
        finally:
            conn.close()

    def blob_exists(self, digest: str) -> bool:
        """``HEAD /api/blobs/<digest>``: True when the daemon already stores the blob (an upload is
        skipped, as Ollama's CLI skips it)."""
        conn, response = self._send("HEAD", f"/api/blobs/{digest}", None, self.timeout)
        try:
            response.read()
        finally:
            conn.close()
        if response.status >= 400 and response.status != 404:
            raise _error_from(response.status, b"")
        return response.status < 300

    def upload_blob(self, digest: str, upload: Upload) -> None:
        """``POST /api/blobs/<digest>`` with the file's bytes (no timeout: a GGUF is gigabytes). The
        daemon checks the digest; a mismatch is its 400."""
        conn, response = self._send("POST", f"/api/blobs/{digest}", None, None, raw=upload)
        try:
            content = response.read()
        finally:
            conn.close()
        if response.status >= 400:
            raise _error_from(response.status, content)

    def chat_stream(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """``POST /api/chat`` with ``stream: true``; yield each NDJSON object until ``done: true``.

        No timeout applies once connected. A non-2xx answer or an in-band ``{"error": ...}`` line raises
        :class:`LlmmanError` with the daemon's text.
        """
        conn, response = self._send("POST", "/api/chat", {**body, "stream": True}, None)
        try:
            if response.status >= 400:
                raise _error_from(response.status, response.read())
            while True:
                line = response.readline()
                if not line:
                    break
                try:
                    chunk = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(chunk, dict):
                    continue
                if chunk.get("error"):
                    raise LlmmanError(str(chunk["error"]))
                yield chunk
                if chunk.get("done"):
                    return
        except (OSError, http.client.HTTPException) as exc:
            raise LlmmanError(f"chat: {exc or type(exc).__name__}") from exc
        finally:
            conn.close()
        raise LlmmanError("the daemon closed the stream before it was done")


def _error_from(status: int, content: bytes) -> LlmmanError:
    """The :class:`LlmmanError` for a non-2xx answer: the body's ``error`` text (Ollama or OpenAI shape),
    else the raw body, else the status."""
    text = content.decode("utf-8", "replace").strip()
    message = text or f"HTTP {status}"
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            error = error.get("message")
        if error:
            message = str(error)
    if status == 404 and message.startswith("model '") and message.endswith("' not found"):
        return ModelNotFound(message[len("model '") : -len("' not found")])
    return LlmmanError(message, status=status)
