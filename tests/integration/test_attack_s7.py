"""Session 7's attack findings on real daemons, each a test that failed before its fix (brief s7/a_attack).

- A peer could have a lending node start any number of ``ggml-rpc-server`` workers: one byte reserved each,
  each a process with a thread per CPU (40 such leases: 40 processes, 216 MiB resident for 40 bytes
  reserved). A node now lends at most llmman.sched.lending.MAX_WORKERS at once (503
  ``rpc_workers_exhausted`` past that), counted with the leases still starting.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmman.sched.lending import MAX_WORKERS
from tests.integration.daemons import Daemon, wait_until
from tests.integration.test_rpc_workers import WORKERS, lend, lending_daemon, node, rpc_children

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(300)]


@pytest.fixture
def lender(tmp_path: Path, model_file: Path) -> Iterator[Daemon]:
    d = lending_daemon(tmp_path, model_file)
    try:
        yield d
    finally:
        d.stop()


def test_a_node_lends_a_bounded_number_of_workers_even_to_concurrent_leases(lender: Daemon) -> None:
    extra = 6
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: lend(lender, 1, owner=f"peer-{i}"), range(MAX_WORKERS + extra)))
    lent = [r.json()["id"] for r in answers if r.status_code == 201]
    refused = [r for r in answers if r.status_code != 201]
    assert len(lent) == MAX_WORKERS, [r.text for r in refused]
    assert len(refused) == extra
    assert all(r.status_code == 503 and f"at most {MAX_WORKERS} RPC workers" in r.text
               for r in refused), [r.text for r in refused]
    assert len(rpc_children(lender)) == MAX_WORKERS
    assert node(lender)["rpc"] == {"serve": True, "reserved": MAX_WORKERS, "workers": MAX_WORKERS}

    gone = lent.pop()
    assert httpx.delete(f"{lender.url}{WORKERS}/{gone}", timeout=30).json() == {"stopped": True}
    again = lend(lender, 1)
    assert again.status_code == 201, again.text  # the slot came back with the worker
    lent.append(again.json()["id"])

    for worker_id in lent:
        assert httpx.delete(f"{lender.url}{WORKERS}/{worker_id}", timeout=30).json() == {"stopped": True}
    assert node(lender)["rpc"] == {"serve": True, "reserved": 0, "workers": 0}
    wait_until(lambda: not rpc_children(lender), "every worker reaped")
