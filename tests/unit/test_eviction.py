"""The eviction policy, table-tested."""

from __future__ import annotations

import pytest

from llmman.sched.eviction import Candidate, choose_victims

MB = 10**6
SMALL = Candidate("small", 100 * MB, reload_cost=90 * MB)
BIG = Candidate("big", 500 * MB, reload_cost=450 * MB)
MID = Candidate("mid", 300 * MB, reload_cost=250 * MB)
BUSY = Candidate("busy", 400 * MB, busy=True, reload_cost=300 * MB)
PINNED = Candidate("pinned", 800 * MB, pinned=True, reload_cost=700 * MB)


@pytest.mark.parametrize(
    ("candidates", "need_bytes", "need_count", "victims"),
    [
        ([SMALL, BIG, MID], 0, 0, []),  # nothing needed
        ([SMALL, BIG, MID], 250 * MB, 0, ["mid"]),  # cheapest reload that frees enough alone
        ([SMALL, BIG, MID], 50 * MB, 0, ["small"]),
        ([SMALL, BIG, MID], 350 * MB, 0, ["big"]),
        ([SMALL, BIG, MID], 700 * MB, 0, ["big", "mid"]),  # biggest first, then the cheapest that completes
        ([SMALL, BIG, MID], 0, 1, ["small"]),  # a count-only need takes the cheapest
        ([SMALL, BUSY], 300 * MB, 0, ["small", "busy"]),  # idle first, busy only when idle ones are short
        ([SMALL, BUSY], 50 * MB, 0, ["small"]),
        ([PINNED, BUSY], 100 * MB, 0, ["busy"]),  # a pinned model goes after even a busy one
        ([PINNED, SMALL], 500 * MB, 0, ["small", "pinned"]),
        ([SMALL], 10**12, 0, ["small"]),  # not enough anywhere: everything
        ([], 100 * MB, 0, []),
    ],
)
def test_choose_victims(
    candidates: list[Candidate], need_bytes: int, need_count: int, victims: list[str]
) -> None:
    assert choose_victims(candidates, need_bytes=need_bytes, need_count=need_count) == victims
