"""A small typed client of the daemon's HTTP API (the Ollama routes), used by the CLI.

httpx is imported on first use, not at import time: it costs ~100 ms and ``llmman --help`` or
``llmman config`` never need it. Management calls have a finite timeout; ``chat_stream`` has none (a
model may take minutes to load and to answer). Errors come back as :class:`LlmmanError` carrying the
daemon's ``{"error": "..."}`` text and HTTP status; when nothing answers at all the error is
:class:`DaemonUnreachable` (``could not connect to llmman serve at URL``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from llmman.errors import LlmmanError, ModelNotFound, ServiceUnavailable

if TYPE_CHECKING:
    import httpx

__all__ = ["DaemonClient", "DaemonUnreachable"]

_TIMEOUT = 60.0
_PROBE_TIMEOUT = 2.0


class DaemonUnreachable(ServiceUnavailable):
    """Nothing answered at the daemon's address (connection refused, unreachable, timed out)."""

    code = "daemon_unreachable"

    def __init__(self, url: str, hint: str | None = None) -> None:
        text = f"could not connect to llmman serve at {url}"
        super().__init__(f"{text} — {hint}" if hint else text)
        self.url = url


class DaemonClient:
    """Blocking client of one daemon at ``base_url`` (e.g. ``http://127.0.0.1:17434``)."""

    def __init__(self, base_url: str, *, timeout: float = _TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._client: httpx.Client | None = None

    def _http(self) -> httpx.Client:
        if self._client is None:
            import httpx

            # trust_env=False: the daemon is local or named by LLMMAN_HOST; proxies must not intercept it.
            self._client = httpx.Client(base_url=self.base_url, timeout=self.timeout, trust_env=False)
        return self._client

    def close(self) -> None:
        """Close the pooled connections (the client can be used again afterwards)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: object = None, *, timeout: float | None = None) -> Any:
        """Send one request; return the decoded JSON body (None when empty). Non-2xx raises."""
        import httpx

        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs["content"] = json.dumps(body).encode()
            kwargs["headers"] = {"content-type": "application/json"}
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            response = self._http().request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise DaemonUnreachable(self.base_url) from exc
        except httpx.HTTPError as exc:
            raise LlmmanError(f"{method} {path}: {exc or type(exc).__name__}") from exc
        if response.status_code >= 400:
            raise _error_from(response.status_code, response.content)
        if not response.content.strip():
            return None
        try:
            return json.loads(response.content)
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
        import httpx

        try:
            self._http().get("/api/version", timeout=_PROBE_TIMEOUT)
        except httpx.HTTPError:
            return False
        return True

    def tags(self) -> list[dict[str, Any]]:
        """``GET /api/tags`` -> the stored models (Ollama shape)."""
        return list((self._request("GET", "/api/tags") or {}).get("models") or [])

    def ps(self) -> list[dict[str, Any]]:
        """``GET /api/ps`` -> the loaded models (Ollama shape plus ``started_at``/``processor``/``node``)."""
        return list((self._request("GET", "/api/ps") or {}).get("models") or [])

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

    def chat_stream(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """``POST /api/chat`` with ``stream: true``; yield each NDJSON object until ``done: true``.

        No timeout applies. A non-2xx answer or an in-band ``{"error": ...}`` line raises
        :class:`LlmmanError` with the daemon's text.
        """
        import httpx

        payload = json.dumps({**body, "stream": True}).encode()
        headers = {"content-type": "application/json"}
        try:
            with self._http().stream(
                "POST", "/api/chat", content=payload, headers=headers, timeout=None
            ) as response:
                if response.status_code >= 400:
                    raise _error_from(response.status_code, response.read())
                for line in response.iter_lines():
                    if not line.strip():
                        continue
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
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise DaemonUnreachable(self.base_url) from exc
        except httpx.HTTPError as exc:
            raise LlmmanError(f"chat: {exc or type(exc).__name__}") from exc
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
