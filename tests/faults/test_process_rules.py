"""The pure rules behind the process faults (no daemon): poison-request suspicion
(llmman.sched.healing), the progress-aware hang decision (llmman.runner.health) and a child log whose
file fails (llmman.runner.logs, with ``/dev/full`` as the file: every write fails with ENOSPC)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from llmman.runner.health import WatchdogPolicy, hung_reason, is_stalled
from llmman.runner.logs import ChildLog
from llmman.sched import healing


def test_a_request_is_poison_after_two_crashes_within_the_window() -> None:
    one = healing.suspect(None, cause="killed by a signal", now=100.0)
    assert one.strikes == 1 and one.refused_until() == 100.0  # one crash may be a coincidence
    two = healing.suspect(one, cause="killed by a signal", now=110.0)
    assert two.strikes == 2 and two.refused_until() == 110.0 + healing.POISON_BASE_S
    three = healing.suspect(two, cause="killed by a signal", now=200.0)
    assert three.refused_until() == 200.0 + 2 * healing.POISON_BASE_S  # doubling
    stale = healing.suspect(two, cause="x", now=110.0 + healing.POISON_WINDOW_S + 1)
    assert stale.strikes == 1  # forgotten after the window
    many = healing.Suspicion(strikes=40, last=0.0, cause="x")
    assert many.refused_until() == healing.POISON_CAP_S
    assert two.refused_until(scale=0.1) == pytest.approx(110.0 + healing.POISON_BASE_S * 0.1)


@pytest.mark.parametrize(("failures", "quiet", "stalled"), [
    (3, 29.0, False),  # probes unanswered, but tokens flowed 29 s ago: busy, not hung
    (3, 30.0, True),   # 3 x max(10 s interval, 5 s timeout) of nothing at all
    (2, 100.0, False),  # not enough unanswered probes yet
])  # fmt: skip
def test_a_child_is_hung_only_without_answers_and_without_progress(failures: int, quiet: float,
                                                                    stalled: bool) -> None:  # fmt: skip
    assert is_stalled(failures, WatchdogPolicy(10.0), quiet) is stalled


def test_a_short_interval_still_waits_for_the_probe_timeouts() -> None:
    policy = WatchdogPolicy(0.2)  # probes may take 1 s each
    assert not is_stalled(3, policy, 2.9) and is_stalled(3, policy, 3.0)
    assert hung_reason(6.2, 3.4) == "hung (no /health answer for 6 s, no progress for 3 s)"


def test_a_failing_log_file_keeps_the_ring_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    link = tmp_path / "child.log"
    link.symlink_to("/dev/full")
    log = ChildLog(link, ring_lines=10)
    log.open()
    with caplog.at_level(logging.WARNING, logger="llmman.runner.logs"):
        log.note("starting")
        log.feed("stderr", b"line one\nline two\npartial")
        log.finish("stderr")
        log.close()
    assert log.tail(3) == ["line one", "line two", "partial"]
    assert log.dropped == 4
    assert [r.getMessage() for r in caplog.records].count(
        f"cannot write the llama-server log {link} (No space left on device): its output is still "
        "read, but what cannot be written is dropped") == 1
