"""The conformance suite: official client SDKs (anthropic, openai, ollama, litellm) against real daemons
serving SmolLM2-135M through a real llama-server (fixtures shared with tests/integration).

Every test that takes ``base_url`` runs twice: ``[local]`` talks to ``daemon`` (the node holding the
model) directly, ``[hop]`` talks to ``front``, a second daemon on 127.0.0.2 with an empty store whose only
peer is ``daemon``, so each request crosses the aggregation's forwarding hop (``x-llmman-hop: 1``).
One model daemon and one front serve the whole session. Tests that inspect ``daemon`` (its children)
still pass through the hop, because the front forwards to that very daemon. The daemon's store also holds
``smollm2-agent:135m`` (tests/conformance/agent_model.py: SmolLM2 with a template that renders tools and
thinks when asked), for the tool_use and thinking tests.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.agent_model import AGENT_NAME, write_agent_model
from tests.integration.conftest import MODEL_NAME, model_file
from tests.integration.daemons import Daemon, model_daemon, start_daemon

__all__ = ["base_url", "daemon", "front", "model_file"]

MODES = ("local", "hop")


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> Iterator[Daemon]:
    """One real daemon with smollm2:135m and smollm2-agent:135m in its store, shared by the whole
    conformance session."""
    from llmman.refs import parse_reference
    from llmman.store import Store

    tmp = tmp_path_factory.mktemp("daemon")
    agent = write_agent_model(model_file, tmp_path_factory.mktemp("agent") / "smollm2-agent.gguf")
    Store(tmp / "store").build(parse_reference(AGENT_NAME), agent)
    agent.unlink()  # the store has its own copy
    with model_daemon(tmp, model_file, MODEL_NAME, extra_env={"LLMMAN_NUM_PARALLEL": "4"}) as d:
        yield d


@pytest.fixture(scope="session")
def front(tmp_path_factory: pytest.TempPathFactory, daemon: Daemon) -> Iterator[Daemon]:
    """A daemon with an empty store on 127.0.0.2 whose one peer is ``daemon``: it forwards everything."""
    d = start_daemon(tmp_path_factory.mktemp("front"), host="127.0.0.2",
                     extra_env={"LLMMAN_PEERS": daemon.url})
    yield d
    if d.process.poll() is None:
        d.stop(signal.SIGTERM)


@pytest.fixture(scope="module", params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """``local`` (straight to the model's node) or ``hop`` (through ``front``)."""
    return str(request.param)


@pytest.fixture(scope="module")
def base_url(mode: str, daemon: Daemon, request: pytest.FixtureRequest) -> str:
    """The URL clients talk to: the daemon itself, or the front that forwards to it."""
    if mode == "local":
        return daemon.url
    front_daemon: Daemon = request.getfixturevalue("front")
    return front_daemon.url


@pytest.fixture
def local_only(mode: str) -> None:
    """For a test that only makes sense against the model's own node: skipped in the hop run."""
    if mode == "hop":
        pytest.skip("checks the node itself, not the forwarding hop")


@pytest.fixture(autouse=True)
def _front_stays_empty(request: pytest.FixtureRequest) -> Iterator[None]:
    """In the hop run, the front must forward, never serve: it ends each test with no child of its own."""
    hop = "base_url" in request.fixturenames and request.getfixturevalue("mode") == "hop"
    front_daemon: Daemon | None = request.getfixturevalue("front") if hop else None  # before teardown
    yield
    if front_daemon is not None:
        assert front_daemon.children() == [], "the front served a model itself instead of forwarding"
