"""The one shape of a stream transducer: a child's answer bytes in, the client's bytes out.

Every streamed answer goes through a :class:`Transducer` (api/relay.py drives it): ``feed`` each chunk
as it arrives, ``close`` once at the end of the child's stream, or ``error`` once when the stream broke
(the child died, a peer stalled) — which renders the dialect's in-band error frame
(:func:`llmman.protocol.errors.error_frame`). Each returns the bytes to send now (``b""`` for none).

Implementations: :class:`Passthrough` (OpenAI chat/text completions and Responses, the child's bytes
with the model name echoed and llama-server's slips fixed by
:class:`~llmman.protocol.openai.stream.OpenAIStream`), :class:`SSETransducer` around an event-level transducer
(Anthropic's :class:`~llmman.protocol.anthropic.messages.AnthropicStream` and
:class:`~llmman.protocol.anthropic.tools.ForcedToolStream`), and
:class:`~llmman.protocol.ollama.ndjson.OllamaNdjson` (SSE to Ollama's NDJSON). No I/O here.
"""

from __future__ import annotations

from typing import Protocol

from llmman.errors import LlmmanError
from llmman.protocol.errors import Dialect, error_frame
from llmman.protocol.framing import SSEDecoder, SSEEvent
from llmman.protocol.model_echo import ModelEcho
from llmman.protocol.openai.stream import OpenAIStream


class Transducer(Protocol):
    """A child's stream to a client's stream, chunk by chunk."""

    def feed(self, chunk: bytes) -> bytes:
        """The client's bytes for one chunk of the child's answer."""
        ...

    def close(self) -> bytes:
        """The client's last bytes once the child's answer has ended."""
        ...

    def error(self, exc: LlmmanError) -> bytes:
        """The in-band frame ending a stream that broke with ``exc``."""
        ...


class EventTransducer(Protocol):
    """A transducer that works on decoded SSE events (see :class:`SSETransducer`)."""

    def feed(self, event: SSEEvent) -> bytes: ...

    def close(self) -> bytes: ...

    def error(self, message: str, status: int = 500) -> bytes: ...


class SSETransducer:
    """Decodes the child's SSE bytes into events for an :class:`EventTransducer`."""

    def __init__(self, events: EventTransducer) -> None:
        self.events = events
        self._decoder = SSEDecoder()

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self.events.feed(event) for event in self._decoder.feed(chunk))

    def close(self) -> bytes:
        out = b"".join(self.events.feed(event) for event in self._decoder.close())
        return out + self.events.close()

    def error(self, exc: LlmmanError) -> bytes:
        return self.events.error(exc.message, exc.status)


class Passthrough:
    """The child's bytes as they are, except its ``"model":"<alias>"`` becomes the name the client sent
    (``echo``; None changes nothing) and, with ``fix``, what :class:`OpenAIStream` fixes (a missing first
    event, a drifting ``created``, usage in its own chunk, object tool arguments); a break is the
    ``dialect``'s in-band frame."""

    def __init__(self, dialect: Dialect, echo: ModelEcho | None = None,
                 fix: OpenAIStream | None = None) -> None:
        self.dialect = dialect
        self.echo = echo
        self.fix = fix

    def feed(self, chunk: bytes) -> bytes:
        out = chunk if self.echo is None else self.echo.feed(chunk)
        return out if self.fix is None else self.fix.feed(out)

    def close(self) -> bytes:
        out = b"" if self.echo is None else self.echo.flush()
        if self.fix is None:
            return out
        return self.fix.feed(out) + self.fix.flush() if out else self.fix.flush()

    def error(self, exc: LlmmanError) -> bytes:
        return error_frame(self.dialect, exc.message, exc.status, exc.code)
