"""Pulling a model stored in Ollama's registry format from a REAL registry (Debian's docker-registry).

The artifact is pushed as ``ollama push`` shapes it (tests/integration/ollama_push.py): a Docker v2
manifest, a Docker image config, ``application/vnd.ollama.image.model`` / ``.template`` / ``.license`` /
``.system`` / ``.params`` layers. The puller stores it as is (same manifest digest); the store serves
its weights and reads its system prompt and parameters as a derived model's; a real daemon pulls it on
first use and answers with the real llama-server, in two dialects.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmman.refs import parse_reference
from llmman.registry.puller import Puller
from llmman.store import Store, read_extras
from llmman.store.model import layer_role
from tests.integration.daemons import start_daemon
from tests.integration.ollama_push import push_ollama_model
from tests.integration.registry import Registry, available, start_registry

pytestmark = [pytest.mark.integration, pytest.mark.model,
              pytest.mark.skipif(not available(), reason="docker-registry missing")]

ASK = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def pushed(registry: Registry, model_file: Path) -> str:
    return push_ollama_model(registry.host, "library/smollm2", "135m", model_file, system="You are terse.",
                             params={"temperature": 0, "num_predict": 12})


def test_pull_ollama_format_into_the_store(tmp_path: Path, registry: Registry, pushed: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMMAN_INSECURE_REGISTRIES", registry.host)
    store = Store(tmp_path / "store")
    model = Puller(store).pull(parse_reference(f"{registry.host}/library/smollm2:135m"))
    assert model.digest == pushed
    assert [layer_role(d) for d in model.layers] == ["model", "other", "other", "other", "other"]
    assert store.files(model).model.stat().st_size > 90_000_000
    extras = read_extras(store.layout, model)
    assert extras.system == "You are terse." and extras.parameters["num_predict"] == 12
    assert extras.license == ["Apache 2.0"]
    assert store.info(model).architecture == "llama"


def test_a_daemon_pulls_and_serves_it(tmp_path: Path, registry: Registry, pushed: str) -> None:
    name = f"{registry.host}/library/smollm2:135m"
    d = start_daemon(tmp_path, extra_env={"LLMMAN_INSECURE_REGISTRIES": registry.host})
    try:
        with d.client() as c:
            r = c.post("/api/chat", json={"model": name, "messages": ASK, "stream": False})
            assert r.status_code == 200, r.text
            assert "paris" in r.json()["message"]["content"].lower()
            r = c.post("/v1/chat/completions", json={"model": name, "messages": ASK, "max_tokens": 12})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"].strip()
            show = c.post("/api/show", json={"model": name}).json()
            assert show["system"] == "You are terse."
            tags = {m["name"]: m["digest"] for m in c.get("/api/tags").json()["models"]}
            assert tags[name] == pushed.split(":", 1)[1]
    finally:
        d.stop()
