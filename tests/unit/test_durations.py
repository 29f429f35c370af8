from __future__ import annotations

import math

import pytest

from llmman.durations import format_duration, parse_duration
from llmman.errors import BadRequest


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        # JSON numbers: seconds, fractions allowed, negative = forever (Ollama api.Duration)
        (0, 0.0),
        (300, 300.0),
        (1.5, 1.5),
        (-1, math.inf),
        (-0.5, math.inf),
        (math.inf, math.inf),
        # Go durations
        ("0", 0.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1h30m15s", 5415.0),
        ("300ms", 0.3),
        ("1.5h", 5400.0),
        (".5s", 0.5),
        ("2us", 2e-6),
        ("2µs", 2e-6),
        ("10ns", 1e-8),
        ("+5m", 300.0),
        ("-1m", math.inf),
        ("-1h30m", math.inf),
        ("-0s", 0.0),
        ("24h", 86400.0),
        # llmman leniency: bare number strings are seconds
        ("300", 300.0),
        ("1.5", 1.5),
        ("-1", math.inf),
        ("-0", 0.0),
        (" 5m ", 300.0),
        ("forever", math.inf),
        ("Forever", math.inf),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", 'time: invalid duration "abc"'),
        ("", 'time: invalid duration ""'),
        ("-", 'time: invalid duration "-"'),
        ("5m30", 'time: missing unit in duration "5m30"'),
        ("1d", 'time: unknown unit "d" in duration "1d"'),
        ("5 m", 'time: unknown unit " m" in duration "5 m"'),
        ("1e3", 'time: unknown unit "e" in duration "1e3"'),
        ("inf", 'time: invalid duration "inf"'),
        ("nan", 'time: invalid duration "nan"'),
    ],
)
def test_parse_duration_rejects_bad_strings(value: str, message: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_duration(value)
    assert str(info.value) == message
    assert info.value.status == 400


@pytest.mark.parametrize("value", [True, False, None, [], {}, math.nan])
def test_parse_duration_rejects_other_types(value: object) -> None:
    with pytest.raises(BadRequest, match="invalid keep_alive"):
        parse_duration(value)


def test_parse_duration_names_the_field() -> None:
    with pytest.raises(BadRequest, match=r"invalid server\.load_timeout: unsupported type 'bool'"):
        parse_duration(True, what="server.load_timeout")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (300, "5m0s"),
        (5400, "1h30m0s"),
        (5415.5, "1h30m15.5s"),
        (1.5, "1.5s"),
        (30, "30s"),
        (0.3, "300ms"),
        (0.0015, "1.5ms"),
        (2e-6, "2µs"),
        (1e-8, "10ns"),
        (86400, "24h0m0s"),
        (math.inf, "forever"),
        (-1, "forever"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [0.0, 0.25, 1.5, 59.999, 300.0, 5415.5, 86400.0, 1e-6, math.inf])
def test_format_then_parse_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)
