"""The token counts an answer reports, read from the bytes sent to the client, in any dialect.

Every dialect reports usage in its answer's last object or event, except Anthropic's input tokens, which
a stream sends first (``message_start``): so :func:`usage_of` reads the start and the end of the answer
(:class:`AnswerSample`), never the middle. The keys: OpenAI ``prompt_tokens`` / ``completion_tokens``,
Anthropic and Responses ``input_tokens`` / ``output_tokens``, Ollama ``prompt_eval_count`` /
``eval_count``. The last figure found wins (a stream's final usage is its total).

This runs on the data path (llmman.api.observed), so it is cheap: :meth:`AnswerSample.feed` only keeps a
reference to each chunk, compacting to the last :data:`TAIL_BYTES` now and then, and the readers search
backwards from the end (``bytes.rfind`` for each key, the last KiB first, then the number after it)
instead of scanning every byte with a regular expression.
"""

from __future__ import annotations

import re

HEAD_BYTES = 4096
TAIL_BYTES = 8192

_PROMPT = (b'"prompt_tokens"', b'"input_tokens"', b'"prompt_eval_count"')
_COMPLETION = (b'"completion_tokens"', b'"output_tokens"', b'"eval_count"')
_PREDICTED = (b'"predicted_per_second"',)
_EVAL_DURATION = (b'"eval_duration"',)
_INTEGER = re.compile(rb"\s*:\s*(\d+)")
_NUMBER = re.compile(rb"\s*:\s*([0-9.eE+-]+)")
_MESSAGE = re.compile(rb'"(?:message|error)"\s*:\s*"((?:[^"\\]|\\.){1,500})"')


class AnswerSample:
    """The first :data:`HEAD_BYTES` and the last :data:`TAIL_BYTES` of an answer, fed as it goes out.

    :meth:`feed` only appends the chunk; once more than twice :data:`TAIL_BYTES` are held they are joined
    and cut to the last :data:`TAIL_BYTES` (the first join also keeps the head), so the work per byte is
    constant and what is held stays under ``HEAD_BYTES + 2 * TAIL_BYTES`` plus one chunk.
    """

    __slots__ = ("_chunks", "_dropped", "_head", "_held")

    def __init__(self) -> None:
        self._head: bytes | None = None  # set at the first compaction (or the first read)
        self._chunks: list[bytes] = []
        self._held = 0  # bytes in _chunks
        self._dropped = 0  # bytes compacted away

    def feed(self, chunk: bytes) -> None:
        """Another piece of the answer."""
        self._chunks.append(chunk)
        self._held += len(chunk)
        if self._held > 2 * TAIL_BYTES:
            self._compact()

    def _compact(self) -> None:
        joined = b"".join(self._chunks)
        if self._head is None:
            self._head = joined[:HEAD_BYTES]
        kept = joined[-TAIL_BYTES:]
        self._chunks = [kept]
        self._dropped += len(joined) - len(kept)
        self._held = len(kept)

    def _joined(self) -> bytes:
        if len(self._chunks) != 1:
            self._chunks = [b"".join(self._chunks)]
        return self._chunks[0]

    @property
    def size(self) -> int:
        """Bytes fed so far."""
        return self._dropped + self._held

    @property
    def head(self) -> bytes:
        """The first :data:`HEAD_BYTES` of the answer (all of it when it is shorter)."""
        return self._head if self._head is not None else self._joined()[:HEAD_BYTES]

    @property
    def tail(self) -> bytes:
        """The last :data:`TAIL_BYTES` of the answer (all of it when it is shorter)."""
        return self._joined()[-TAIL_BYTES:]


_WINDOW = 1024  # the end of a text searched first: usage is in an answer's last event


def _latest(text: bytes, keys: tuple[bytes, ...], value: re.Pattern[bytes]) -> bytes | None:
    """The value after the last of ``keys`` in ``text`` that is followed by one (``value``), else None.
    The last :data:`_WINDOW` bytes are searched first, then the whole text."""
    end = len(text)
    start = max(0, end - _WINDOW)
    while True:
        at, key = max((text.rfind(k, start, end), k) for k in keys)
        if at < 0:
            if start == 0:
                return None
            start = 0  # nothing whole in the window: the rest (the window again, a few hundred ns)
            continue
        match = value.match(text, at + len(key))
        if match is not None:
            return match.group(1)
        end = at


def _last(keys: tuple[bytes, ...], *texts: bytes) -> int | None:
    """The last integer after one of ``keys`` in ``texts`` read in order (a later text's wins)."""
    for text in reversed(texts):
        found = _latest(text, keys, _INTEGER)
        if found is not None:
            return int(found)
    return None


def usage_of(sample: AnswerSample) -> tuple[int | None, int | None]:
    """``(prompt tokens, completion tokens)`` the answer reports, None where it reports none."""
    # The tail holds the head too when the answer is short; reading both then only finds the same figures.
    head, tail = sample.head, sample.tail
    return _last(_PROMPT, head, tail), _last(_COMPLETION, head, tail)


def speed_of(sample: AnswerSample) -> float | None:
    """Generation tokens/s the answer reports: llama-server's ``timings.predicted_per_second`` (passed
    through by the OpenAI-shaped routes), else Ollama's ``eval_count`` over ``eval_duration`` (ns)."""
    tail = sample.tail
    predicted = _latest(tail, _PREDICTED, _NUMBER)
    if predicted is not None:
        try:
            speed = float(predicted)
        except ValueError:
            speed = 0.0
        if speed > 0:
            return speed
    duration = _last(_EVAL_DURATION, tail)
    count = _last(_COMPLETION, tail)
    if duration and count:
        return count / (duration / 1e9)
    return None


def error_of(sample: AnswerSample) -> str:
    """The error message an error answer (or a stream's in-band error frame) carries, else ``""``."""
    found = [m.group(1) for m in _MESSAGE.finditer(sample.tail)]
    return found[-1].decode("utf-8", "replace") if found else ""
