"""Fill-in-the-middle answers: llama-server's native ``/infill`` chunks -> Ollama ``/api/generate`` objects.

``/api/generate`` with a ``suffix`` runs on llama-server's ``/infill`` (protocol/ollama/request.py), whose
stream is the native one: ``{"content": ..., "stop": false}`` per token, then a last chunk with
``stop: true``, ``stop_type`` (``limit`` when ``n_predict`` ran out) and ``timings``. :class:`InfillStream`
reads those as the ``/v1/completions`` chunks :class:`~llmman.protocol.ollama.stream.OllamaStream` knows,
so the answer has the same shape, metrics and ``done_reason`` as every other ``/api/generate``.
"""

from __future__ import annotations

from llmman.protocol.ollama.stream import OllamaStream

__all__ = ["InfillStream", "completion_chunk"]


def completion_chunk(chunk: dict[str, object]) -> dict[str, object]:
    """One native ``/infill`` chunk as a ``/v1/completions`` chunk: ``content`` as the choice's ``text``; on
    the last chunk (``stop``) the ``finish_reason`` (``length`` for ``stop_type: limit``, else ``stop``),
    and ``usage`` from ``tokens_evaluated``/``tokens_predicted``. An error chunk stays as it is."""
    if chunk.get("error") is not None:
        return chunk
    content = chunk.get("content")
    choice: dict[str, object] = {"index": 0, "text": content if isinstance(content, str) else ""}
    out: dict[str, object] = {"choices": [choice]}
    if chunk.get("stop") is True:
        choice["finish_reason"] = "length" if chunk.get("stop_type") == "limit" else "stop"
        prompt, predicted = chunk.get("tokens_evaluated"), chunk.get("tokens_predicted")
        if isinstance(prompt, int) and isinstance(predicted, int):
            out["usage"] = {"prompt_tokens": prompt, "completion_tokens": predicted,
                            "total_tokens": prompt + predicted}
    if isinstance(timings := chunk.get("timings"), dict):
        out["timings"] = timings
    return out


class InfillStream(OllamaStream):
    """:class:`OllamaStream` (kind ``generate``) fed native ``/infill`` chunks."""

    def feed(self, chunk: dict[str, object]) -> list[dict[str, object]]:
        """As :meth:`OllamaStream.feed`, for a native chunk (:func:`completion_chunk`)."""
        return super().feed(completion_chunk(chunk))
