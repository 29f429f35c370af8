"""The token counts an answer reports, read from the bytes sent to the client, in any dialect.

Every dialect reports usage in its answer's last object or event, except Anthropic's input tokens, which
a stream sends first (``message_start``): so :func:`usage_of` reads the start and the end of the answer
(:class:`AnswerSample`), never the middle. The keys: OpenAI ``prompt_tokens`` / ``completion_tokens``,
Anthropic and Responses ``input_tokens`` / ``output_tokens``, Ollama ``prompt_eval_count`` /
``eval_count``. The last figure found wins (a stream's final usage is its total).
"""

from __future__ import annotations

import re

HEAD_BYTES = 4096
TAIL_BYTES = 8192

_PROMPT = re.compile(rb'"(?:prompt_tokens|input_tokens|prompt_eval_count)"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"(?:completion_tokens|output_tokens|eval_count)"\s*:\s*(\d+)')
_PREDICTED = re.compile(rb'"predicted_per_second"\s*:\s*([0-9.eE+-]+)')
_EVAL_DURATION = re.compile(rb'"eval_duration"\s*:\s*(\d+)')
_MESSAGE = re.compile(rb'"(?:message|error)"\s*:\s*"((?:[^"\\]|\\.){1,500})"')


class AnswerSample:
    """The first :data:`HEAD_BYTES` and the last :data:`TAIL_BYTES` of an answer, fed as it goes out."""

    def __init__(self) -> None:
        self.head = b""
        self._tail = bytearray()
        self.size = 0

    def feed(self, chunk: bytes) -> None:
        """Another piece of the answer."""
        self.size += len(chunk)
        if len(self.head) < HEAD_BYTES:
            self.head += chunk[:HEAD_BYTES - len(self.head)]
        self._tail += chunk
        if len(self._tail) > 2 * TAIL_BYTES:
            del self._tail[:-TAIL_BYTES]

    @property
    def tail(self) -> bytes:
        return bytes(self._tail[-TAIL_BYTES:])


def _last(pattern: re.Pattern[bytes], *texts: bytes) -> int | None:
    found: int | None = None
    for text in texts:
        for match in pattern.finditer(text):
            found = int(match.group(1))
    return found


def usage_of(sample: AnswerSample) -> tuple[int | None, int | None]:
    """``(prompt tokens, completion tokens)`` the answer reports, None where it reports none."""
    # The tail holds the head too when the answer is short; reading both then only finds the same figures.
    return _last(_PROMPT, sample.head, sample.tail), _last(_COMPLETION, sample.head, sample.tail)


def speed_of(sample: AnswerSample) -> float | None:
    """Generation tokens/s the answer reports: llama-server's ``timings.predicted_per_second`` (passed
    through by the OpenAI-shaped routes), else Ollama's ``eval_count`` over ``eval_duration`` (ns)."""
    found = [float(m.group(1)) for m in _PREDICTED.finditer(sample.tail)]
    if found and found[-1] > 0:
        return found[-1]
    durations = [int(m.group(1)) for m in _EVAL_DURATION.finditer(sample.tail)]
    count = _last(_COMPLETION, sample.tail)
    if durations and durations[-1] > 0 and count:
        return count / (durations[-1] / 1e9)
    return None


def error_of(sample: AnswerSample) -> str:
    """The error message an error answer (or a stream's in-band error frame) carries, else ``""``."""
    found = [m.group(1) for m in _MESSAGE.finditer(sample.tail)]
    return found[-1].decode("utf-8", "replace") if found else ""
