"""One exception tree for llmman.

Every error llmman raises on purpose derives from :class:`LlmmanError` and knows the HTTP status
it maps to and a short machine ``code``. The API layer renders it in the client's dialect
(Ollama ``{"error": "..."}``, OpenAI ``{"error": {"message", "type", "code"}}``); the CLI prints
``Error: <message>`` and exits 1. Anything else escaping a handler is a bug and becomes a 500
with a generic message (never a stack trace to the client).
"""

from __future__ import annotations


class LlmmanError(Exception):
    """Base of every deliberate llmman error.

    Attributes:
        status: the HTTP status this error maps to (default 500).
        code: a short machine-readable code, e.g. ``"model_not_found"``.
        message: the human text, sent to clients as is.
        retry_after: seconds for a ``Retry-After`` header, or None.
    """

    status: int = 500
    code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def __str__(self) -> str:
        return self.message


class BadRequest(LlmmanError):
    """The client sent something we cannot act on (HTTP 400)."""

    status = 400
    code = "bad_request"


class InvalidReference(BadRequest):
    """A model reference that cannot be parsed (HTTP 400, Ollama's ``invalid model name``)."""

    code = "invalid_reference"


class NotFound(LlmmanError):
    """A thing that does not exist (HTTP 404)."""

    status = 404
    code = "not_found"


class ModelNotFound(NotFound):
    """A model that is not in the store: Ollama's exact text ``model '<name>' not found``."""

    code = "model_not_found"

    def __init__(self, name: str, reason: str | None = None) -> None:
        text = f"model '{name}' not found"
        if reason:
            text = f"{text}: {reason}"
        super().__init__(text)
        self.name = name


class ServiceUnavailable(LlmmanError):
    """Temporarily unable to serve (HTTP 503), optionally with ``Retry-After`` seconds."""

    status = 503
    code = "unavailable"


class ShuttingDown(ServiceUnavailable):
    """The daemon is draining for exit: no new loads or leases (HTTP 503)."""

    code = "shutting_down"

    def __init__(self) -> None:
        super().__init__("llmman is shutting down")


class NotImplementedHere(LlmmanError):
    """A feature llmman does not offer (HTTP 501), e.g. ``/api/create`` with a Go ``template``."""

    status = 501
    code = "not_implemented"


class ServerBusy(ServiceUnavailable):
    """The wait queue is full: Ollama's exact text, two spaces after the full stop."""

    code = "server_busy"

    def __init__(self, retry_after: float = 1.0) -> None:
        super().__init__(
            "server busy, please try again.  maximum pending requests exceeded",
            retry_after=retry_after,
        )


class ConfigError(LlmmanError):
    """A bad setting: unknown key, wrong type, unreadable file (HTTP 500 on the daemon, exit 1 in the CLI)."""

    code = "config_error"


class StoreError(LlmmanError):
    """The OCI store is unreadable, inconsistent, or a write failed."""

    code = "store_error"


class GGUFError(LlmmanError):
    """A file that is not a readable GGUF (bad magic, truncated header, unknown value type)."""

    status = 400
    code = "invalid_gguf"


class RunnerError(LlmmanError):
    """A llama-server child failed: it would not start, died while loading, or died while serving."""

    status = 500
    code = "runner_error"
    cause = "unknown"  # runner.crash.Cause value, set where the child's output named one


class UpstreamError(LlmmanError):
    """llama-server answered an error status before its first byte: its own words, with ``status`` (a 500
    that is really the client's fault is passed here as 400 by the caller)."""

    code = "upstream_error"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message, status=status)


class LoadTimeout(RunnerError):
    """A llama-server child produced no output and did not become ready within the load timeout."""

    code = "load_timeout"


class ClientDisconnected(LlmmanError):
    """The client went away before the answer (Ollama's 499 ``request canceled``)."""

    status = 499
    code = "client_closed_request"

    def __init__(self) -> None:
        super().__init__("request canceled")
