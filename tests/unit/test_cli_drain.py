"""``llmman drain`` / ``undrain``: the verbs' arguments and the progress lines (the real commands run
against daemons in tests/integration/test_drain.py)."""

from __future__ import annotations

import pytest

from llmman.cli.commands_drain import describe, drained
from llmman.cli.main import build_parser


@pytest.mark.parametrize(("argv", "verb", "node", "wait"), [
    (["drain"], "drain", None, False),
    (["drain", "spark", "--wait"], "drain", "spark", True),
    (["drain", "--wait", "10.0.0.5:17434"], "drain", "10.0.0.5:17434", True),
    (["undrain"], "undrain", None, None),
    (["undrain", "spark"], "undrain", "spark", None),
])
def test_arguments(argv: list[str], verb: str, node: str | None, wait: bool | None) -> None:
    args = build_parser().parse_args(argv)
    assert (args.verb, args.node, getattr(args, "wait", None)) == (verb, node, wait)


@pytest.mark.parametrize(("doc", "line", "done"), [
    ({"node": "spark", "state": "draining", "in_flight": 2, "loaded": 1},
     "spark: draining, 2 requests, 1 model loaded", False),
    ({"node": "spark", "state": "draining", "in_flight": 1, "loaded": 0},
     "spark: draining, 1 request, 0 models loaded", False),
    ({"node": "spark", "state": "draining", "in_flight": 0, "loaded": 2},
     "spark: draining, 0 requests, 2 models loaded", False),
    ({"node": "spark", "state": "draining", "in_flight": 0, "loaded": 0},
     "spark: draining, 0 requests, 0 models loaded", True),
    ({"node": "spark", "state": "serving", "in_flight": 3, "loaded": 1},
     "spark: serving, 3 requests, 1 model loaded", False),
])
def test_progress_lines(doc: dict[str, object], line: str, done: bool) -> None:
    assert describe(doc) == line
    assert drained(doc) is done
