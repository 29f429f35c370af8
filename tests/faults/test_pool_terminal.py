"""What a peer reports reaches the terminal of ``llmman nodes`` (and ``ps``) without control characters.

A peer's ``/llmman/node`` names it and its models; ``llmman nodes`` prints them. A name carrying an ANSI
escape or a newline would rewrite the user's terminal or forge table rows. Every cell is written with
its control characters as ``\\xNN`` (llmman.cli.tables.printable).
"""

from __future__ import annotations

from datetime import UTC, datetime

from llmman.cli.tables import nodes_table, ps_table

ESCAPE = "\x1b]0;owned\x07\x1b[2J"


def test_a_peer_name_with_escapes_and_newlines_prints_as_text() -> None:
    node = {"name": f"evil{ESCAPE}\r\nspark (this node)    1.2.3.4", "address": "10.0.0.9:17434",
            "state": "up", "memory": 10, "free": 5, "last_seen": 0.2,
            "models": {f"docker.io/ai/x{ESCAPE}:latest": {"slots": 1, "in_flight": 0, "queued": 0}}}
    text = nodes_table([node])
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert text.count("\n") == 2  # the header and one row: no forged line
    assert "evil\\x1b]0;owned\\x07" in text and "x\\x1b]0;owned" in text


def test_ps_rows_from_a_peer_print_as_text() -> None:
    text = ps_table([{"name": f"m{ESCAPE}\nfake row", "node": "10.0.0.9:17434\x9b31m", "size": 1}],
                    datetime.now(UTC))
    assert "\x1b" not in text and "\x9b" not in text and text.count("\n") == 2
