"""The conformance suite: official client SDKs (anthropic, openai, ollama, litellm) against one real
daemon per module, serving SmolLM2-135M through a real llama-server (fixtures shared with
tests/integration)."""

from __future__ import annotations

import pytest

from tests.integration.conftest import daemon, model_file
from tests.integration.daemons import Daemon

__all__ = ["base_url", "daemon", "model_file"]


@pytest.fixture(scope="module")
def base_url(daemon: Daemon) -> str:
    """The URL clients talk to. Here the daemon itself; the forwarding-hop variant of the suite overrides
    this fixture with a second daemon that has ``daemon`` as its peer, so the same tests run through it."""
    return daemon.url
