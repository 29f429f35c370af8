"""The words of a cold ``llmman run`` (llmman.cli.coldstart), and that nothing is asked or drawn off a
terminal. The spinner on a real pseudo-terminal against real daemons is in tests/integration/test_logs.py."""

from __future__ import annotations

import io
from typing import Any

import pytest
from tests.integration.daemons import free_port

from llmman.cli.client import DaemonClient
from llmman.cli.coldstart import canonical, phase_text, prepare


@pytest.mark.parametrize(("stored_here", "source", "loaded", "text"), [
    (False, None, None, "pulling tiny…"),
    (False, "bee", None, "copying tiny from bee…"),
    (True, None, None, "loading tiny on ay…"),
    (True, None, {"processor": "llama-server (loading)", "node": "bee"}, "loading tiny on bee…"),
    (True, None, {"processor": "llama-server (loading)", "node": "local"}, "loading tiny on ay…"),
    (True, None, {"processor": "llama-server (loading)"}, "loading tiny on ay…"),
    (True, None, {"processor": "llama-server", "node": "bee"}, "waiting for tiny on bee…"),
    (False, "bee", {"processor": "llama-server (loading)", "node": "bee"}, "loading tiny on bee…"),
])
def test_phase_words(stored_here: bool, source: str | None, loaded: dict[str, Any] | None, text: str) -> None:
    assert phase_text("tiny", stored_here=stored_here, source=source, loaded=loaded, this_node="ay") == text


@pytest.mark.parametrize(("transfer", "text"), [
    ({"kind": "copy", "source": "bee", "completed": 41_200_000, "total": 92_100_000},
     "copying tiny from bee… 44 % (41.2 MB / 92.1 MB)"),
    ({"kind": "copy", "source": "", "completed": 0, "total": 0}, "copying tiny from cee…"),
    ({"kind": "pull", "source": "registry-1.docker.io", "completed": 5, "total": 10},
     "pulling tiny… 50 % (5 B / 10 B)"),
    ({"kind": "pull", "completed": 10, "total": 10}, "pulling tiny… 100 % (10 B / 10 B)"),
])
def test_phase_words_with_the_transfer_in_progress(transfer: dict[str, Any], text: str) -> None:
    """A transfer listed by a node's /llmman/node says how far the fetch is (the source named by the
    copy itself, else the node the pool's list named)."""
    assert phase_text("tiny", stored_here=False, source="cee", loaded=None, this_node="ay",
                      transfer=transfer) == text
    loading = {"processor": "llama-server (loading)", "node": "bee"}
    assert phase_text("tiny", stored_here=False, source="cee", loaded=loading, this_node="ay",
                      transfer=transfer) == "loading tiny on bee…"  # the load comes after the fetch


def test_canonical_names_match_the_daemons_lists() -> None:
    assert canonical("tiny") == "docker.io/ai/tiny:latest"
    assert canonical("t", {"t": "qwen:0.5b"}) == "docker.io/ai/qwen:0.5b"
    assert canonical("not a reference!") == "not a reference!"


def test_off_a_terminal_nothing_is_asked_of_the_daemon() -> None:
    """stderr piped: no spinner and no request (the client's daemon does not exist: any request would
    raise DaemonUnreachable)."""
    client = DaemonClient(f"http://127.0.0.1:{free_port()}")
    assert prepare(client, "tiny", aliases=None, out=io.StringIO(), err=io.StringIO()) is None
