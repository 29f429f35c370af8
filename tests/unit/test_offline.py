"""``server.offline``: pulls go only to registries on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmman.errors import LlmmanError
from llmman.refs import parse_reference
from llmman.registry.puller import Puller, is_loopback_host
from llmman.store import Store


@pytest.mark.parametrize(
    ("host", "local"),
    [("localhost:5000", True), ("127.0.0.1", True), ("127.0.0.2:17434", True), ("[::1]:5000", True),
     ("docker.io", False), ("hf.co", False), ("10.0.0.5:5000", False), ("example.localhost", True)],
)
def test_loopback_hosts(host: str, local: bool) -> None:
    assert is_loopback_host(host) is local


@pytest.mark.parametrize("name", ["nope:1b", "docker.io/ai/x:1", "example.com:5000/a/b:c"])
def test_offline_refuses_remote_registries_at_once(tmp_path: Path, name: str) -> None:
    puller = Puller(Store(tmp_path / "store"), offline=True)
    with pytest.raises(LlmmanError) as err:
        puller.ensure(parse_reference(name))
    assert "offline" in err.value.message
    assert Store(tmp_path / "store").list() == []


def test_offline_still_tries_a_loopback_registry(tmp_path: Path) -> None:
    puller = Puller(Store(tmp_path / "store"), offline=True)
    with pytest.raises(LlmmanError) as err:  # nothing listens there: a connection error, not "offline"
        puller.ensure(parse_reference("127.0.0.1:9/ai/x:1"), insecure=True)
    assert "offline" not in err.value.message
