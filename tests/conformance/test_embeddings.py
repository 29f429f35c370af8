"""Embeddings through the ``ollama`` and ``openai`` SDKs: ``/api/embed``, ``/api/embeddings``,
``/v1/embeddings``, served by an embedding child beside the chat child."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import ollama
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.closing import closed_after_test
from tests.conformance.fuzz import bodies, embedding_bodies
from tests.integration.conftest import MODEL_NAME, MODEL_REF
from tests.integration.daemons import Daemon

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_ollama_embed_batch_dimensions_and_legacy(base_url: str) -> None:
    client = closed_after_test(ollama.Client(host=base_url))
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
    client = closed_after_test(ollama.Client(host=base_url))
    client.chat(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2})
    client.embed(model=MODEL_NAME, input="x")
    # this model's children only (the session's daemon also serves smollm2-agent)
    mine = [c.cmdline() for c in daemon.children() if MODEL_REF in c.cmdline()]
    assert len(mine) == 2 and sum("--embeddings" in argv for argv in mine) == 1
    # /api/ps lists the model once, as Ollama does (clients key on the name), with both children's memory
    rows = [m for m in httpx.get(daemon.url + "/api/ps").json()["models"] if m["name"] == MODEL_REF]
    assert [m["processor"] for m in rows] == ["llama-server"], rows


def test_openai_embeddings(base_url: str) -> None:
    client = closed_after_test(openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0))
    out = client.embeddings.create(model=MODEL_NAME, input=["a", "b", "c"])
    assert [d.index for d in out.data] == [0, 1, 2] and len(out.data[0].embedding) == 576
    assert out.usage.prompt_tokens > 0
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope:1b", input="x")


def test_openai_embeddings_dimensions(base_url: str) -> None:
    """llama-server ignores ``dimensions``: llmman cuts and renormalises, as OpenAI and Ollama do."""
    client = closed_after_test(openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0))
    full = client.embeddings.create(model=MODEL_NAME, input="hello world").data[0].embedding
    cut = client.embeddings.create(model=MODEL_NAME, input="hello world", dimensions=8).data[0].embedding
    assert len(full) == 576 and len(cut) == 8
    assert math.isclose(math.fsum(v * v for v in cut), 1.0, rel_tol=1e-3)
    norm = math.sqrt(math.fsum(v * v for v in full[:8]))
    assert all(math.isclose(a, b / norm, abs_tol=1e-4) for a, b in zip(cut, full[:8], strict=True))
    b64 = client.embeddings.create(model=MODEL_NAME, input="hello world", dimensions=8,
                                   encoding_format="base64").data[0].embedding
    row = struct.unpack("<8f", base64.b64decode(str(b64)))  # little-endian float32, cut to 8 as well
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(row, cut, strict=True))
    for dims in (0, -4):
        with pytest.raises(openai.BadRequestError) as bad:
            client.embeddings.create(model=MODEL_NAME, input="x", dimensions=dims)
        assert bad.value.param == "dimensions" and bad.value.code is None


def test_errors(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=120) as c:
        r = c.post("/api/embed", json={"model": "nope:1b", "input": "x"})
        assert r.status_code == 404 and r.json() == {"error": "model 'nope:1b' not found"}
        r = c.post("/api/embed", json={"model": MODEL_NAME, "input": [1, 2]})
        assert r.status_code == 400 and r.json() == {"error": "invalid input type"}
        empty = c.post("/api/embed", json={"model": MODEL_NAME, "input": []}).json()
        assert empty["embeddings"] == []
        for dims in (0, -1):
            r = c.post("/api/embed", json={"model": MODEL_NAME, "input": "x", "dimensions": dims})
            assert (r.status_code, r.json()) == (400, {"error": "dimensions must be a positive integer"})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies("model", "input", "prompt", "dimensions", "truncate", "keep_alive")
       | embedding_bodies(MODEL_NAME),
       path=st.sampled_from(["/api/embed", "/api/embeddings", "/v1/embeddings"]))
def test_fuzzed_bodies_never_500(base_url: str, body: bytes, path: str) -> None:
    r = httpx.post(base_url + path, content=body, timeout=60)
    assert r.status_code < 500, r.text
    if r.status_code == 400:
        err = r.json()["error"]
        assert isinstance(err, str) if path.startswith("/api/") else err["type"] == "invalid_request_error"


SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank. "  # about 14 tokens


def test_long_inputs_fit_or_truncate(base_url: str) -> None:
    """Inputs over llama-server's default 512-token batch embed (the child's -b/-ub follow its context);
    inputs over the context are cut to it (Ollama's ``truncate``, default true, also on the OpenAI and
    legacy routes) or, with ``truncate: false``, refused with Ollama's 400."""
    client = closed_after_test(ollama.Client(host=base_url, timeout=300))
    small = {"num_ctx": 512}  # a child already loaded with a larger context is reused: bounds below allow it
    medium = client.embed(model=MODEL_NAME, input=SENTENCE * 45, options=small)  # about 600 tokens
    assert len(medium.embeddings[0]) == 576 and (medium.prompt_eval_count or 0) > 500
    huge = SENTENCE * 360  # about 5000 tokens, over any context this suite loads
    cut = client.embed(model=MODEL_NAME, input=["short one", huge], options=small)
    assert [len(v) for v in cut.embeddings] == [576, 576]
    assert math.isclose(math.fsum(v * v for v in cut.embeddings[1]), 1.0, rel_tol=1e-3)
    assert 500 < (cut.prompt_eval_count or 0) < 4800
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model=MODEL_NAME, input=huge, truncate=False, options=small)
    assert refused.value.status_code == 400
    assert refused.value.error == "the input length exceeds the context length"
    assert len(client.embeddings(model=MODEL_NAME, prompt=huge, options=small).embedding) == 576
    oai = closed_after_test(openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                                          timeout=300))
    out = oai.embeddings.create(model=MODEL_NAME, input=[huge, SENTENCE * 45])
    assert [len(d.embedding) for d in out.data] == [576, 576] and out.usage.prompt_tokens < 2 * 4800
