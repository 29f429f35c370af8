"""Tool-call round trips through ``/api/chat`` with the official ``ollama`` client. SmolLM2 cannot call
tools, so the daemon's child is the fake llama-server answering FAKE_TOOL_CALL (its ``arguments``
spread over several SSE chunks) for a model whose chat template mentions tools; the tool result then
goes back and the fake answers with text. Also: ``/api/show`` reports the ``tools`` capability."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import ollama
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from tests.closing import closed_after_test
from tests.fakes.fake_llama_server import make_launcher
from tests.integration.daemons import Daemon, start_daemon
from tests.unit.ggufgen import TOOLS_THINK_TEMPLATE, write_gguf

pytestmark = [pytest.mark.integration]

MODEL = "toolie:latest"
CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}]  # fmt: skip


@pytest.fixture(scope="module")
def fake_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("tools")
    gguf = write_gguf(tmp / "toolie.gguf", chat_template=TOOLS_THINK_TEMPLATE)
    Store(tmp / "store").build(parse_reference(MODEL), gguf)
    (tmp / "bin").mkdir()
    env = {"LLMMAN_LLAMA_SERVER": str(make_launcher(tmp / "bin")), "FAKE_TOOL_CALL": json.dumps(CALL),
           "FAKE_REPLY": "It is sunny in Paris."}  # fmt: skip
    d = start_daemon(tmp, extra_env=env)
    yield d
    if d.process.poll() is None:
        d.stop(signal.SIGTERM)


def test_show_reports_tools_and_thinking(fake_daemon: Daemon) -> None:
    shown = closed_after_test(ollama.Client(host=fake_daemon.url)).show(MODEL)
    assert shown.capabilities == ["completion", "tools", "thinking"]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip(fake_daemon: Daemon, stream: bool) -> None:
    client = closed_after_test(ollama.Client(host=fake_daemon.url))
    messages: list[dict[str, object] | ollama.Message] = [{"role": "user", "content": "Weather in Paris?"}]
    if stream:
        parts = list(client.chat(model=MODEL, messages=messages, tools=TOOLS, stream=True, think=False))
        calls = [c for p in parts for c in (p.message.tool_calls or [])]
        assert parts[-1].done and parts[-1].done_reason == "stop"
        assert all(p.message.content == "" for p in parts if p.message.tool_calls)
    else:
        reply = client.chat(model=MODEL, messages=messages, tools=TOOLS, think=False)
        calls = list(reply.message.tool_calls or [])
        messages.append(reply.message)
    assert len(calls) == 1
    assert calls[0].function.name == "get_weather" and calls[0].function.arguments == CALL["arguments"]
    if stream:
        messages.append({"role": "assistant", "content": "", "tool_calls": [c.model_dump() for c in calls]})
    messages.append({"role": "tool", "tool_name": "get_weather", "content": '{"sky": "sunny"}'})
    answer = client.chat(model=MODEL, messages=messages, tools=TOOLS, think=False)
    assert answer.message.content == "It is sunny in Paris." and not answer.message.tool_calls
