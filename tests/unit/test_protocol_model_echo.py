"""Table tests of the model-name echo in passed-through answers (protocol/model_echo.py)."""

from __future__ import annotations

import pytest

from llmman.protocol.model_echo import ModelEcho, model_field, rewrite_chunk

OLD = model_field("docker.io/ai/smollm2:135m")
NEW = model_field("smollm2:135m")
SSE = (b'data: {"choices":[],"model":"docker.io/ai/smollm2:135m","id":"x"}\n\n'
       b'data: {"model":"docker.io/ai/smollm2:135m"}\n\ndata: [DONE]\n\n')
STREAMS = [
    SSE,
    b'{"id":"r","model":"docker.io/ai/smollm2:135m","usage":{}}',
    b'"model":"docker.io/ai/smollm2:135m""model":"docker.io/ai/smollm2:135m"',  # back to back
    b'"model":"docker.io/ai/smollm2:135', b'"model":"docker.io/ai/smollm2:135m',  # never completed
    b'x"model":"docker.io/ai/smollm2:13"model":"docker.io/ai/smollm2:135m"y',  # a false start
    b'"model":"other"', b"",
]


def test_model_field_is_compact_escaped_json() -> None:
    assert OLD == b'"model":"docker.io/ai/smollm2:135m"'
    assert model_field('a"b\\c') == b'"model":"a\\"b\\\\c"'
    assert model_field("caf\u00e9") == '"model":"caf\u00e9"'.encode()


@pytest.mark.parametrize("stream", STREAMS)
def test_every_single_split_gives_the_whole_stream_replace(stream: bytes) -> None:
    want = stream.replace(OLD, NEW)
    for cut in range(len(stream) + 1):
        echo = ModelEcho(OLD, NEW)
        got = echo.feed(stream[:cut]) + echo.feed(stream[cut:]) + echo.flush()
        assert got == want, cut


@pytest.mark.parametrize("stream", STREAMS)
def test_byte_by_byte(stream: bytes) -> None:
    echo = ModelEcho(OLD, NEW)
    assert b"".join(echo.feed(stream[i:i + 1]) for i in range(len(stream))) + echo.flush() == \
        stream.replace(OLD, NEW)


def test_whole_events_hold_nothing_back() -> None:
    """An SSE chunk ends in a blank line: nothing waits for the next chunk."""
    assert rewrite_chunk(b"", SSE, OLD, NEW) == (SSE.replace(OLD, NEW), b"")
    out, carry = rewrite_chunk(b"", b'data: {"model":"docker', OLD, NEW)
    assert (out, carry) == (b"data: {", b'"model":"docker')
    out, carry = rewrite_chunk(b'"', b'"model":"docker.io/ai/smollm2:135m"', OLD, NEW)  # '"' ends and starts
    assert (out, carry) == (b'"' + NEW, b"")


def test_equal_names_mean_no_rewriter() -> None:
    assert ModelEcho.between("smollm2:135m", "smollm2:135m") is None
    echo = ModelEcho.between("docker.io/ai/smollm2:135m", "smollm2")
    assert echo is not None and echo.new == b'"model":"smollm2"'
