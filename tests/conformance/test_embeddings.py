"""Embeddings through the ``ollama`` and ``openai`` SDKs: ``/api/embed``, ``/api/embeddings``,
``/v1/embeddings``, served by an embedding child beside the chat child."""

from __future__ import annotations

import math

import httpx
import ollama
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conformance.fuzz import bodies
from tests.integration.conftest import MODEL_NAME
from tests.integration.daemons import Daemon

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_ollama_embed_batch_dimensions_and_legacy(base_url: str) -> None:
    client = ollama.Client(host=base_url)
    out = client.embed(model=MODEL_NAME, input=["hello world", "the sky is blue"])
    assert out.model == MODEL_NAME and len(out.embeddings) == 2
    assert len(out.embeddings[0]) == 576  # SmolLM2-135M embedding length
    assert math.isclose(math.fsum(v * v for v in out.embeddings[0]), 1.0, rel_tol=1e-3)
    assert out.embeddings[0] != out.embeddings[1] and (out.prompt_eval_count or 0) > 2
    cut = client.embed(model=MODEL_NAME, input="hello world", dimensions=8)
    assert len(cut.embeddings[0]) == 8
    assert math.isclose(math.fsum(v * v for v in cut.embeddings[0]), 1.0, rel_tol=1e-3)
    legacy = client.embeddings(model=MODEL_NAME, prompt="hello world")
    assert len(legacy.embedding) == 576
    pairs = zip(legacy.embedding, out.embeddings[0], strict=True)
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in pairs)


def test_chat_and_embedding_children_side_by_side(base_url: str, daemon: Daemon) -> None:
    """Through the hop too: the front has no model, so both children run on ``daemon``."""
    client = ollama.Client(host=base_url)
    client.chat(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2})
    client.embed(model=MODEL_NAME, input="x")
    assert len(daemon.children()) == 2
    assert sum("--embeddings" in c.cmdline() for c in daemon.children()) == 1


def test_openai_embeddings(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    out = client.embeddings.create(model=MODEL_NAME, input=["a", "b", "c"])
    assert [d.index for d in out.data] == [0, 1, 2] and len(out.data[0].embedding) == 576
    assert out.usage.prompt_tokens > 0
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope:1b", input="x")


def test_errors(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=120) as c:
        r = c.post("/api/embed", json={"model": "nope:1b", "input": "x"})
        assert r.status_code == 404 and r.json() == {"error": "model 'nope:1b' not found"}
        r = c.post("/api/embed", json={"model": MODEL_NAME, "input": [1, 2]})
        assert r.status_code == 400 and r.json() == {"error": "invalid input type"}
        empty = c.post("/api/embed", json={"model": MODEL_NAME, "input": []}).json()
        assert empty["embeddings"] == []


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies("model", "input", "prompt", "dimensions", "truncate", "keep_alive"),
       path=st.sampled_from(["/api/embed", "/api/embeddings", "/v1/embeddings"]))
def test_fuzzed_bodies_never_500(base_url: str, body: bytes, path: str) -> None:
    r = httpx.post(base_url + path, content=body, timeout=60)
    assert r.status_code < 500, r.text
