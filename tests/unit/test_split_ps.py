"""``llmman ps`` for a model split over nodes (llmman.cli.tables.node_cell): NODE shows every node's size."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from llmman.cli.tables import node_cell, ps_table

NOW = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)
SPLIT = [{"node": "alpha", "size": 197_400_000}, {"node": "10.0.0.3:17434", "size": 88_000_000}]


def test_node_cell_names_every_share_in_order() -> None:
    assert node_cell({"split": SPLIT}) == "alpha 197.4 MB + 10.0.0.3:17434 88.0 MB"
    assert node_cell({"node": "10.0.0.2:17434", "split": SPLIT}) == \
        "10.0.0.2:17434: alpha 197.4 MB + 10.0.0.3:17434 88.0 MB"
    assert node_cell({"node": "spark"}) == "spark"
    assert node_cell({"node": "spark", "split": []}) == "spark"


def test_a_split_entry_brings_the_node_column() -> None:
    entry = {"name": "docker.io/ai/gemma3:270m", "digest": "ab" * 32, "size": 285_400_000,
             "processor": "llama-server", "expires_at": (NOW + timedelta(minutes=4, seconds=5)).isoformat(),
             "split": SPLIT}
    lines = ps_table([entry], NOW).splitlines()
    assert lines[0].split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "STARTED", "NODE", "UNTIL"]
    assert "285.4 MB" in lines[1] and "alpha 197.4 MB + 10.0.0.3:17434 88.0 MB" in lines[1]
