"""LiteLLM against llmman: the ``ollama_chat`` provider (``/api/chat``), ``ollama`` embeddings
(``/api/embed``), the ``openai`` provider on ``/v1`` (chat, listing through the SDK LiteLLM wraps) and
errors mapped to LiteLLM's exception types. Runs against ``base_url`` (the daemon, or a forwarding hop)."""

from __future__ import annotations

import litellm
import pytest

from tests.integration.conftest import MODEL_NAME

pytestmark = [pytest.mark.integration, pytest.mark.model]

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def test_ollama_chat_streamed_and_not(base_url: str) -> None:
    reply = litellm.completion(model=f"ollama_chat/{MODEL_NAME}", api_base=base_url, messages=QUESTION,
                               temperature=0, max_tokens=16)  # fmt: skip
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    chunks = list(litellm.completion(model=f"ollama_chat/{MODEL_NAME}", api_base=base_url, messages=QUESTION,
                                     temperature=0, max_tokens=16, stream=True))  # fmt: skip
    assert len(chunks) > 1
    assert "Paris" in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_openai_provider_chat_streamed_and_not(base_url: str) -> None:
    kwargs = {"model": f"openai/{MODEL_NAME}", "api_base": base_url + "/v1", "api_key": "unused",
              "messages": QUESTION, "temperature": 0, "max_tokens": 16}  # fmt: skip
    reply = litellm.completion(**kwargs)
    assert "Paris" in (reply.choices[0].message.content or "")
    text = "".join(c.choices[0].delta.content or "" for c in litellm.completion(**kwargs, stream=True))
    assert "Paris" in text


def test_embeddings_both_providers(base_url: str) -> None:
    native = litellm.embedding(model=f"ollama/{MODEL_NAME}", api_base=base_url, input=["hello", "world"])
    assert [len(d["embedding"]) for d in native.data] == [576, 576]
    v1 = litellm.embedding(model=f"openai/{MODEL_NAME}", api_base=base_url + "/v1", api_key="unused",
                           input="hello")  # fmt: skip
    assert len(v1.data[0]["embedding"]) == 576


def test_listing(base_url: str) -> None:
    params = litellm.types.router.LiteLLM_Params(model="openai/x", api_base=base_url + "/v1",
                                                 api_key="unused")
    ids = litellm.get_valid_models(check_provider_endpoint=True, custom_llm_provider="openai",
                                   litellm_params=params)  # fmt: skip
    assert any(MODEL_NAME in i for i in ids)


def test_errors_are_litellm_exceptions(base_url: str) -> None:
    with pytest.raises(litellm.NotFoundError):
        litellm.completion(model="openai/no-such-model:1", api_base=base_url + "/v1", api_key="unused",
                           messages=QUESTION, max_retries=0)  # fmt: skip
    with pytest.raises(litellm.NotFoundError, match="model 'no-such-model:1' not found"):
        litellm.completion(model="ollama_chat/no-such-model:1", api_base=base_url, messages=QUESTION)
