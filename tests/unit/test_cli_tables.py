"""Table tests for the CLI's pure formatters (llmman.cli.tables)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from llmman.cli.tables import (
    format_ago,
    format_show,
    format_size,
    format_until,
    list_table,
    processor,
    ps_table,
    render_table,
    short_id,
    to_datetime,
)

NOW = datetime(2026, 9, 1, 12, 0, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def ahead(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.0 kB"),
        (1500, "1.5 kB"),
        (999_999, "1000.0 kB"),
        (98_300_000, "98.3 MB"),
        (1_234_567_890, "1.2 GB"),
        (2_000_000_000_000, "2.0 TB"),
        (-5, "0 B"),
    ],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "just now"),
        (59, "just now"),
        (60, "1 minute ago"),
        (119, "1 minute ago"),
        (120, "2 minutes ago"),
        (3599, "59 minutes ago"),
        (3600, "1 hour ago"),
        (7200, "2 hours ago"),
        (86399, "23 hours ago"),
        (86400, "yesterday"),
        (2 * 86400 - 1, "yesterday"),
        (2 * 86400, "2 days ago"),
        (6 * 86400, "6 days ago"),
        (7 * 86400, "1 week ago"),
        (15 * 86400, "2 weeks ago"),
        (30 * 86400, "1 month ago"),
        (90 * 86400, "3 months ago"),
        (365 * 86400, "1 year ago"),
        (3 * 365 * 86400, "3 years ago"),
        (-500, "just now"),  # a time in the future counts as now
    ],
)
def test_format_ago(seconds: int, text: str) -> None:
    assert format_ago(ago(seconds), NOW) == text


def test_format_ago_accepts_rfc3339_and_unix_seconds() -> None:
    assert format_ago("2026-09-01T11:55:00Z", NOW) == "5 minutes ago"
    assert format_ago("2026-09-01T13:54:59.123456789+02:00", NOW) == "5 minutes ago"
    assert format_ago(ago(7200).timestamp(), NOW) == "2 hours ago"
    assert format_ago("not a time", NOW) == "unknown"
    assert format_ago(None, NOW) == "unknown"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (30, "less than a minute from now"),
        (60, "1 minute from now"),
        (4 * 60 + 30, "4 minutes from now"),
        (3600, "1 hour from now"),
        (5 * 3600, "5 hours from now"),
        (3 * 86400, "3 days from now"),
        (19 * 365 * 86400, "19 years from now"),
        (21 * 365 * 86400, "Forever"),
        (0, "Stopping..."),
        (-10, "Stopping..."),
    ],
)
def test_format_until(seconds: int, text: str) -> None:
    assert format_until(ahead(seconds), NOW) == text


def test_format_until_missing_and_far_future_strings() -> None:
    assert format_until(None, NOW) == "Forever"
    assert format_until("", NOW) == "Forever"
    assert format_until("2318-04-01T00:00:00Z", NOW) == "Forever"  # Ollama's "forever"
    assert format_until("garbage", NOW) == "unknown"


@pytest.mark.parametrize(
    ("entry", "text"),
    [
        ({"processor": "llama-server", "size": 10, "size_vram": 0}, "llama-server"),
        ({"processor": "llama-server", "size": 10, "size_vram": 10}, "llama-server"),
        ({"processor": "llama-server (loading)", "size": 10, "size_vram": 0}, "llama-server (loading)"),
        ({"size": 10, "size_vram": 0}, "100% CPU"),
        ({"size": 10, "size_vram": 10}, "100% GPU"),
        ({"processor": "failed (out of memory)", "size": 0, "size_vram": 0}, "failed (out of memory)"),
        ({"size": 0, "size_vram": 0}, "100% CPU"),
        ({"size": 100, "size_vram": 0}, "100% CPU"),
        ({"size": 100, "size_vram": 100}, "100% GPU"),
        ({"size": 100, "size_vram": 52}, "48%/52% CPU/GPU"),
        ({"size": 100, "size_vram": 200}, "Unknown"),
        ({}, "100% CPU"),
        ({"processor": "", "size": 4, "size_vram": 4}, "100% GPU"),
    ],
)
def test_processor(entry: dict[str, object], text: str) -> None:
    assert processor(entry) == text


def test_short_id_and_to_datetime() -> None:
    hexd = "a" * 12 + "b" * 52
    assert short_id(f"sha256:{hexd}") == "a" * 12
    assert short_id(hexd) == "a" * 12
    assert to_datetime(True) is None
    naive = datetime(2026, 1, 1)
    assert to_datetime(naive) == naive.replace(tzinfo=UTC)


def test_render_table_pads_with_four_spaces_and_trims() -> None:
    text = render_table(["NAME", "ID"], [["a", "x"], ["longer-name", ""]])
    assert text == "NAME           ID\na              x\nlonger-name\n"


def test_render_table_header_only_when_empty() -> None:
    assert render_table(["NAME", "ID", "SIZE", "MODIFIED"], []) == "NAME    ID    SIZE    MODIFIED\n"


def test_ps_table_columns_and_values() -> None:
    models = [
        {
            "name": "docker.io/ai/smollm2:135m",
            "digest": "0123456789abcdef" * 4,
            "size": 98_300_000,
            "size_vram": 0,
            "processor": "llama-server",
            "context_length": 4096,
            "started_at": ago(5 * 60).isoformat(),
            "expires_at": ahead(4 * 60 + 5).isoformat(),
        },
        {
            "name": "hf.co/owner/repo:Q4_K_M",
            "digest": "fedcba9876543210" * 4,
            "size": 1_200_000_000,
            "size_vram": 1_200_000_000,
            "expires_at": "2318-01-01T00:00:00Z",
        },
    ]
    lines = ps_table(models, NOW).splitlines()
    assert lines[0].split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "STARTED", "UNTIL"]
    assert lines[0].startswith("NAME                         ID              ")
    assert lines[1] == (
        "docker.io/ai/smollm2:135m    0123456789ab    98.3 MB    llama-server    4096       "
        "5 minutes ago    4 minutes from now"
    )
    assert lines[2] == (
        "hf.co/owner/repo:Q4_K_M      fedcba987654    1.2 GB     100% GPU                   "
        "                 Forever"
    )


def test_ps_table_node_column_only_when_some_entry_has_a_node() -> None:
    base = {"name": "m:latest", "digest": "ab" * 32, "size": 1, "expires_at": ago(1).isoformat()}
    assert "NODE" not in ps_table([base, {**base, "node": ""}], NOW)
    lines = ps_table([base, {**base, "node": "spark"}], NOW).splitlines()
    assert lines[0].split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "STARTED", "NODE", "UNTIL"]
    assert lines[1].endswith("Stopping...")
    assert lines[2].split()[-2:] == ["spark", "Stopping..."]


def test_ps_table_failed_entry_has_empty_until() -> None:
    base = {"name": "m:latest", "digest": "ab" * 32, "size": 1, "expires_at": ago(1).isoformat()}
    lines = ps_table([{**base, "processor": "failed (out of memory)"}, base], NOW).splitlines()
    assert lines[1].endswith("failed (out of memory)") and "Stopping" not in lines[1]
    assert lines[2].endswith("Stopping...")


def test_ps_table_empty_prints_header() -> None:
    assert ps_table([], NOW) == "NAME    ID    SIZE    PROCESSOR    CONTEXT    STARTED    UNTIL\n"


def test_list_table() -> None:
    models = [
        {"name": "docker.io/ai/smollm2:135m", "digest": "sha256:" + "1" * 64, "size": 999,
         "modified_at": ago(120).isoformat()},
        {"name": "x:latest", "digest": "2" * 64, "size": 5_000_000,
         "modified_at": ago(3 * 86400).timestamp()},
    ]
    assert list_table(models, NOW).splitlines() == [
        "NAME                         ID              SIZE      MODIFIED",
        "docker.io/ai/smollm2:135m    111111111111    999 B     2 minutes ago",
        "x:latest                     222222222222    5.0 MB    3 days ago",
    ]


def test_format_show_summary() -> None:
    data = {
        "details": {"family": "llama", "parameter_size": "135M", "quantization_level": "Q8_0"},
        "model_info": {"general.architecture": "llama", "llama.context_length": 8192,
                       "llama.embedding_length": 576},
        "capabilities": ["completion", "tools"],
        "parameters": 'stop                           "<|im_end|>"\ntemperature 0.2',
        "license": "Apache License\nVersion 2.0\nmore\n",
    }
    text = format_show(data)
    assert text.splitlines() == [
        "  Model",
        "    architecture        llama",
        "    parameters          135M",
        "    context length      8192",
        "    embedding length    576",
        "    quantization        Q8_0",
        "",
        "  Capabilities",
        "    completion",
        "    tools",
        "",
        "  Parameters",
        '    stop           "<|im_end|>"',
        "    temperature    0.2",
        "",
        "  License",
        "    Apache License",
        "    Version 2.0",
        "    ...",
    ]
    assert "Metadata" not in text
    verbose = format_show(data, verbose=True)
    assert "  Metadata" in verbose
    assert "    llama.embedding_length    576" in verbose
