"""The Ollama streaming answer as a byte-level :class:`~llmman.protocol.transducer.Transducer`.

llama-server's SSE chunks are decoded, fed to :class:`~llmman.protocol.ollama.stream.OllamaStream` and
written as NDJSON lines; :meth:`OllamaNdjson.close` adds the one ``done: true`` line with the metrics,
:meth:`OllamaNdjson.error` the in-band ``{"error": ...}`` line. Events that are empty, ``[DONE]``, not
JSON or not an object are skipped. Durations come from the injected ``elapsed_ns`` (no clock here).
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from llmman.errors import LlmmanError
from llmman.protocol.errors import Dialect, error_frame
from llmman.protocol.framing import SSEDecoder, ndjson
from llmman.protocol.ollama.stream import OllamaStream


class OllamaNdjson:
    """SSE bytes from the child -> Ollama NDJSON bytes.

    Args:
        stream: the object-level transducer (kept: ``stream: false`` answers read its aggregate).
        elapsed_ns: nanoseconds since the request arrived, for ``total_duration``.
        load_ns: nanoseconds the model took to load for this request (``load_duration``).
    """

    def __init__(self, stream: OllamaStream, elapsed_ns: Callable[[], int], load_ns: int) -> None:
        self.stream = stream
        self._elapsed_ns = elapsed_ns
        self._load_ns = load_ns
        self._decoder = SSEDecoder()

    def _objects(self, data: str) -> bytes:
        if not data or data == "[DONE]":
            return b""
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(chunk, dict):
            return b""
        return b"".join(ndjson(obj) for obj in self.stream.feed(chunk))

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._objects(event.data) for event in self._decoder.feed(chunk))

    def drain(self) -> None:
        """End of a ``stream: false`` answer: the decoder's last events, for :meth:`OllamaStream.single`."""
        for event in self._decoder.close():
            self._objects(event.data)

    def close(self) -> bytes:
        out = b"".join(self._objects(event.data) for event in self._decoder.close())
        final = self.stream.final(total_duration_ns=self._elapsed_ns(), load_duration_ns=self._load_ns)
        return out + ndjson(final)

    def error(self, exc: LlmmanError) -> bytes:
        return error_frame(Dialect.OLLAMA, exc.message, exc.status, exc.code)
