"""The table of transfers in progress (llmman.registry.progress): bytes move as progress lines come, the
entry goes when the transfer ends, a failed one stays a while with its error; the puller lists a pull
that fails on a registry that does not answer, and a Hugging Face pull while it runs; a peer's
``transfers`` are read checked (llmman.cluster.state.transfers_of)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from tests.fakes.fake_hf_hub import FakeHub
from tests.integration.daemons import free_port
from tests.unit.ggufgen import write_gguf

from llmman.cluster.state import TRANSFERS_MAX, transfers_of
from llmman.errors import LlmmanError
from llmman.refs import parse_reference
from llmman.registry import progress
from llmman.registry.client import RegistryOptions
from llmman.registry.progress import COPY, PULL, Transfers
from llmman.registry.puller import Puller
from llmman.store import Store


def test_progress_moves_and_the_entry_goes_at_the_end() -> None:
    table = Transfers()
    assert table.snapshot() == []
    passed: list[dict[str, Any]] = []
    with table.track("docker.io/ai/tiny:latest", PULL, "registry-1.docker.io") as transfer:
        emit = transfer.feeding(passed.append)
        [entry] = table.snapshot()
        assert entry["model"] == "docker.io/ai/tiny:latest" and entry["kind"] == PULL
        assert entry["source"] == "registry-1.docker.io" and (entry["completed"], entry["total"]) == (0, 0)
        assert "error" not in entry and entry["started_at"] > 0
        transfer.expect({"sha256:a": 100, "sha256:b": 50})
        assert table.snapshot()[0]["total"] == 150  # the manifest's blobs, before any has started
        emit({"status": "pulling a", "digest": "sha256:a", "total": 100, "completed": 40})
        emit({"status": "pulling b", "digest": "sha256:b", "total": 50, "completed": 50})
        [entry] = table.snapshot()
        assert (entry["completed"], entry["total"], entry["status"]) == (90, 150, "pulling b")
        emit({"status": "pulling a", "digest": "sha256:a", "total": 100, "completed": 100})
        emit({"status": "verifying sha256 digest"})
        [entry] = table.snapshot()
        assert (entry["completed"], entry["total"]) == (150, 150)  # a blob counted once however often
        assert entry["status"] == "verifying sha256 digest"
    assert table.snapshot() == []
    assert passed[0]["digest"] == "sha256:a" and len(passed) == 4  # every line passed on as it was


def test_a_failed_transfer_stays_with_its_error_then_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    table = Transfers()
    with pytest.raises(LlmmanError), table.track("tiny", COPY, "10.0.0.8:17434"):
        raise LlmmanError("the peer went away", status=502)
    [entry] = table.snapshot()
    assert entry["error"] == "the peer went away" and entry["kind"] == COPY
    first = entry["elapsed"]
    assert table.snapshot()[0]["elapsed"] == first  # its clock stopped when it failed
    monkeypatch.setattr(progress, "FAILED_KEEP_S", -1.0)  # its time is up
    assert table.snapshot() == []


def test_a_new_transfer_replaces_a_failed_one_of_the_same_model() -> None:
    table = Transfers()
    with pytest.raises(OSError), table.track("tiny", PULL, "a"):
        raise OSError("disk full")
    with table.track("tiny", PULL, "a"):
        [entry] = table.snapshot()
        assert "error" not in entry
    assert table.snapshot() == []


def test_parallel_blobs_add_up() -> None:
    table = Transfers()
    with table.track("big", PULL, "r") as transfer:
        emit = transfer.feeding(lambda _line: None)

        def blob(i: int) -> None:
            for done in range(0, 1001, 10):
                emit({"status": f"pulling {i}", "digest": f"sha256:{i}", "total": 1000, "completed": done})

        threads = [threading.Thread(target=blob, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        [entry] = table.snapshot()
        assert (entry["completed"], entry["total"]) == (6000, 6000)


def test_the_puller_lists_a_pull_that_fails(tmp_path: Path) -> None:
    """A registry that does not answer: the pull raises, and the table shows it failed, from that host."""
    host = f"127.0.0.1:{free_port()}"
    puller = Puller(Store(tmp_path / "store"))
    with pytest.raises(LlmmanError):
        puller.pull(parse_reference(f"{host}/ai/nothing:latest"), insecure=True)
    [entry] = puller.transfers.snapshot()
    assert entry["model"] == f"{host}/ai/nothing:latest" and entry["kind"] == PULL
    assert entry["source"] == host and entry["error"]


def test_a_hugging_face_pull_is_listed_while_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each progress line of the pull finds it in the table (its lines are emitted while it runs), with
    its bytes as far as that line says; the table is empty once it has returned."""
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")  # huggingface_hub's own switch, read by it
    gguf = write_gguf(tmp_path / "tiny.gguf", arch="llama")
    hub = FakeHub({"owner/tiny-GGUF": {"tiny-Q4_K_M.gguf": gguf.read_bytes()}})
    try:
        puller = Puller(Store(tmp_path / "store"), options=RegistryOptions(hf_endpoint=hub.url))
        seen: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        puller.pull(parse_reference("hf.co/owner/tiny-GGUF"),
                    lambda line: seen.append((line, puller.transfers.snapshot())))
    finally:
        hub.close()
    assert puller.transfers.snapshot() == []
    for line, listed in seen[:-1]:  # all but the last ("success", emitted once the manifest is stored)
        [entry] = listed
        assert entry["model"] == "hf.co/owner/tiny-GGUF:latest" and entry["kind"] == PULL
        assert entry["source"] == hub.url.split("//", 1)[1] and entry["status"] == line["status"]
        if "completed" in line:
            assert (entry["completed"], entry["total"]) == (line["completed"], line["total"])
    assert any(line.get("completed") == gguf.stat().st_size for line, _ in seen)


def test_an_offline_refusal_is_no_transfer(tmp_path: Path) -> None:
    puller = Puller(Store(tmp_path / "store"), offline=True)
    with pytest.raises(LlmmanError, match="offline"):
        puller.pull(parse_reference("registry.example/ai/tiny:latest"))
    assert puller.transfers.snapshot() == []


def test_a_peers_transfers_are_read_checked() -> None:
    good = {"model": "m", "kind": "copy", "source": "p:1", "status": "s", "completed": 5, "total": 10,
            "started_at": 1.5, "elapsed": 2.0}
    doc = {"transfers": [good, {**good, "kind": "push"}, {"kind": "pull"}, "junk", None,
                         {**good, "model": "x" * 10_000, "completed": 99, "total": -3, "elapsed": "no",
                          "error": "boom"},
                         {**good, "total": 2**70, "started_at": float("nan")}]}
    first, clipped, huge = transfers_of(doc)
    assert first == good
    assert len(clipped["model"]) == 512 and (clipped["completed"], clipped["total"]) == (0, 0)
    assert clipped["elapsed"] == 0.0 and clipped["error"] == "boom"
    assert huge["total"] == 2**63 - 1 and huge["started_at"] == 0.0
    assert transfers_of({}) == [] and transfers_of({"transfers": {}}) == [] and transfers_of([]) == []
    assert len(transfers_of({"transfers": [good] * 1000})) == TRANSFERS_MAX
