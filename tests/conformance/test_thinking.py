"""Ollama's thinking default through the official ``ollama`` client: a model with the ``thinking``
capability thinks when ``think`` is absent, answers without thinking for
``think: false``, and a model without it refuses ``think: true``. The thinking model is
``smollm2-agent:135m`` (tests/conformance/agent_model.py), whose template thinks only when asked; SmolLM2
never ends its thinking, so with thinking on the whole (short) answer is ``thinking``."""

from __future__ import annotations

import ollama
import pytest

from tests.closing import closed_after_test
from tests.conformance.agent_model import AGENT_NAME
from tests.integration.conftest import MODEL_NAME

pytestmark = [pytest.mark.integration, pytest.mark.model]

HI = [{"role": "user", "content": "Hi"}]


def test_show_reports_thinking_and_tools(base_url: str) -> None:
    shown = closed_after_test(ollama.Client(host=base_url)).show(AGENT_NAME)
    assert shown.capabilities == ["completion", "tools", "thinking"]


@pytest.mark.parametrize("route", ["chat", "generate"])
def test_thinking_is_on_when_think_is_absent(base_url: str, route: str) -> None:
    client = closed_after_test(ollama.Client(host=base_url))
    options = {"num_predict": 6, "temperature": 0}
    if route == "chat":
        reply = client.chat(model=AGENT_NAME, messages=HI, options=options)
        thinking, text = reply.message.thinking, reply.message.content
    else:
        answer = client.generate(model=AGENT_NAME, prompt="Hi", options=options)
        thinking, text = answer.thinking, answer.response
    assert thinking and not text


def test_think_false_answers_without_thinking(base_url: str) -> None:
    client = closed_after_test(ollama.Client(host=base_url))
    reply = client.chat(model=AGENT_NAME, messages=HI, think=False,
                        options={"num_predict": 6, "temperature": 0})
    assert reply.message.content and not reply.message.thinking


def test_streamed_thinking_then_done(base_url: str) -> None:
    client = closed_after_test(ollama.Client(host=base_url))
    parts = list(client.chat(model=AGENT_NAME, messages=HI, stream=True,
                             options={"num_predict": 6, "temperature": 0}))
    assert "".join(p.message.thinking or "" for p in parts)
    assert parts[-1].done and parts[-1].done_reason == "length" and (parts[-1].eval_count or 0) == 6


def test_a_model_without_thinking_refuses_think_true_but_not_absent(base_url: str) -> None:
    client = closed_after_test(ollama.Client(host=base_url))
    with pytest.raises(ollama.ResponseError, match=f'"{MODEL_NAME}" does not support thinking'):
        client.chat(model=MODEL_NAME, messages=HI, think=True)
    reply = client.chat(model=MODEL_NAME, messages=HI, options={"num_predict": 4})
    assert reply.message.content and not reply.message.thinking
