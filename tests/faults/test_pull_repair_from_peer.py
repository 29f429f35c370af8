"""Fault: a blob went bad on a node whose model's registry cannot be reached (issue 13, item 5).

Two real daemons (no model load: a small generated GGUF), both offline, ``b`` naming ``a`` as its peer.
``b``'s copy of the model loses a byte; ``POST /api/verify {"repair": true}`` on ``b`` finds it, cannot
pull from ``docker.io`` (offline), and copies the blob back from ``a``'s ``/v2/``, pinned to the stored
digest. Before the fix a peer copy of a model already in the index did nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from tests.faults.test_store_corrupt_blob import flip_byte
from tests.integration.daemons import free_port, start_daemon
from tests.unit.ggufgen import write_gguf

pytestmark = pytest.mark.integration
NAME = "docker.io/corrupt/me:1"


def test_verify_repairs_from_a_peer_when_the_registry_is_out_of_reach(tmp_path: Path) -> None:
    source = write_gguf(tmp_path / "tiny.gguf", size_label="135M")
    digest = "sha256:" + hashlib.sha256(source.read_bytes()).hexdigest()
    for node in ("a", "b"):
        Store(tmp_path / node / "store").build(parse_reference(NAME), source)
    a_port = free_port("127.0.0.21")
    a = start_daemon(tmp_path / "a", host="127.0.0.21", port=a_port, extra_env={"LLMMAN_PEERS": ""})
    try:
        b = start_daemon(tmp_path / "b", host="127.0.0.22",
                         extra_env={"LLMMAN_PEERS": f"127.0.0.21:{a_port}"})
        try:
            blob = b.store / "blobs" / "sha256" / digest.split(":")[1]
            flip_byte(blob, 200)
            with b.client() as http:
                answer = http.post("/api/verify", json={"repair": True})
            assert answer.status_code == 200, answer.text
            lines = [json.loads(x) for x in answer.text.splitlines()]
            statuses = [x["status"] for x in lines]
            assert "corrupt" in statuses and f"repaired {NAME}" in statuses, lines
            assert lines[-1] == {"status": "done", "checked": lines[-1]["checked"], "bad": 0, "repaired": 1}
            assert blob.read_bytes() == source.read_bytes()
        finally:
            b.stop()
    finally:
        a.stop()
