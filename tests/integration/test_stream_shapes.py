"""Streams every client accepts, whatever the child sends (issue 14 items 0, 1 and 3), through a real
``llmman serve`` whose llama-server is the fake (tests/fakes/fake_llama_server.py) playing llama-server's
slips, each on a model of its own (``FAKE_PER_MODEL``):

* ``dropper``: every stream lacks its first event (``FAKE_DROP_FIRST_EVENT``), as llama-server b11434
  under CPU load: the ``anthropic`` SDK must still yield its text, the ``openai`` SDK's first chat chunk
  carry ``role: "assistant"``, a Responses stream begin with ``response.created``;
* ``ticker``: every chunk a second later (``FAKE_CREATED_STEP``): ``created`` stays the first chunk's;
* ``toolie``: tool-call ``arguments`` as a JSON object (``FAKE_TOOL_ARGS_OBJECT``): a string on the OpenAI
  routes (chat and Responses), the object on ``/api/chat``, streamed and not, with ids; replayed history in
  either form.

Every test runs ``[local]`` (the node) and ``[hop]`` (through ``front``, an empty daemon on 127.0.0.2
whose one peer is the node). Every streamed answer, in every dialect, carries ``X-Accel-Buffering: no``
and ``Cache-Control: no-cache``.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from tests.closing import closed_after_test
from tests.fakes.fake_llama_server import make_launcher
from tests.integration.daemons import Daemon, start_daemon
from tests.unit.ggufgen import TOOLS_THINK_TEMPLATE, write_gguf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPLY = "Hello from the stream shapes."
CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
PER_MODEL = {"dropper": {"FAKE_DROP_FIRST_EVENT": "1"}, "ticker": {"FAKE_CREATED_STEP": "1"},
             "toolie": {"FAKE_TOOL_ARGS_OBJECT": "1", "FAKE_TOOL_CALL": json.dumps(CALL)}}
HI = [{"role": "user", "content": "hi"}]


def _stop(d: Daemon) -> None:
    if d.process.poll() is None:
        d.stop(signal.SIGTERM)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("node")
    store = Store(tmp / "store")
    for name in PER_MODEL:
        extra = {"chat_template": TOOLS_THINK_TEMPLATE} if name == "toolie" else {}
        gguf = write_gguf(tmp / f"{name}.gguf", name=name, **extra)
        store.build(parse_reference(name), gguf)
    (tmp / "bin").mkdir()
    env = {"LLMMAN_LLAMA_SERVER": str(make_launcher(tmp / "bin")), "FAKE_REPLY": REPLY,
           "FAKE_PER_MODEL": json.dumps(PER_MODEL), "LLMMAN_MAX_LOADED_MODELS": "3"}
    d = start_daemon(tmp, extra_env=env)
    yield d
    _stop(d)


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, node: Daemon) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("front"), host="127.0.0.2", extra_env={"LLMMAN_PEERS": node.url})
    yield d
    _stop(d)


@pytest.fixture(params=["local", "hop"])
def url(request: pytest.FixtureRequest, node: Daemon) -> str:
    if request.param == "local":
        return node.url
    front_daemon: Daemon = request.getfixturevalue("front")
    return front_daemon.url


def sse_events(url: str, path: str, body: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """The answer's SSE events as (event name, parsed data), ``[DONE]`` as None."""
    events: list[tuple[str | None, Any]] = []
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        name: str | None = None
        for line in r.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
                events.append((name, None if data == "[DONE]" else json.loads(data)))
                name = None
        return events


def test_an_anthropic_stream_without_message_start_still_gives_the_sdk_its_text(url: str) -> None:
    client = closed_after_test(anthropic.Anthropic(base_url=url, api_key="x", max_retries=0))
    with client.messages.stream(model="dropper", max_tokens=50, messages=HI) as stream:  # type: ignore[arg-type]
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds.count("message_start") == 1
    assert "text" in kinds
    assert "".join(b.text for b in final.content if b.type == "text") == REPLY
    assert final.id.startswith("msg_") and final.model == "dropper"
    assert final.usage.input_tokens == 1  # counted on the child: the fake counts the words ("hi")
    events = sse_events(url, "/v1/messages", {"model": "dropper", "max_tokens": 50, "stream": True,
                                                        "messages": HI})
    assert [name for name, _ in events][:3] == ["message_start", "ping", "content_block_start"]


def test_an_openai_chat_stream_without_its_role_chunk_gets_one_first(url: str) -> None:
    client = closed_after_test(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0))
    chunks = list(client.chat.completions.create(model="dropper", messages=HI, stream=True))  # type: ignore[arg-type]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].delta.role for c in chunks[1:] if c.choices].count("assistant") == 0
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY
    assert chunks[0].id == chunks[1].id and chunks[0].created == chunks[1].created


def test_a_responses_stream_without_response_created_gets_one_first(url: str) -> None:
    client = closed_after_test(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0))
    events = list(client.responses.create(model="dropper", input="hi", stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds.count("response.created") == 1
    assert events[0].response.id == events[1].response.id  # type: ignore[union-attr]  # in_progress's
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == REPLY


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_created_is_the_same_in_every_chunk_of_a_stream(url: str, path: str) -> None:
    body: dict[str, Any] = {"model": "ticker", "stream": True}
    body |= {"messages": HI} if path.endswith("chat/completions") else {"prompt": "hi"}
    events = sse_events(url, path, body)
    created = {data["created"] for _, data in events if data is not None}
    assert len([e for e in events if e[1] is not None]) > 3 and len(created) == 1


def test_openai_tool_arguments_are_a_string_streamed_and_not(url: str) -> None:
    client = closed_after_test(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0))
    whole = client.chat.completions.create(model="toolie", messages=HI, tools=TOOLS)  # type: ignore[arg-type]
    (call,) = whole.choices[0].message.tool_calls or []
    assert call.id and json.loads(call.function.arguments) == CALL["arguments"]  # type: ignore[union-attr]
    pieces = [d for c in client.chat.completions.create(model="toolie", messages=HI, tools=TOOLS,  # type: ignore[arg-type]
                                                        stream=True)
              for d in (c.choices[0].delta.tool_calls or [] if c.choices else [])]
    assert all(isinstance(p.function.arguments, str) for p in pieces if p.function and p.function.arguments)
    assert json.loads("".join(p.function.arguments or "" for p in pieces if p.function)) == CALL["arguments"]
    # the replayed call, its arguments as the object the child wrote, is accepted
    history = [*HI, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather",
                                                         "arguments": CALL["arguments"]}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    r = httpx.post(url + "/v1/chat/completions", timeout=60,
                   json={"model": "toolie", "messages": history, "tools": TOOLS})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == REPLY


def test_responses_tool_arguments_are_a_string_streamed_and_not(url: str) -> None:
    client = closed_after_test(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0))
    parameters = TOOLS[0]["function"]["parameters"]
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": parameters}]
    whole = client.responses.create(model="toolie", input="Weather in Paris?", tools=tools)
    (call,) = whole.output
    assert call.type == "function_call" and json.loads(call.arguments) == CALL["arguments"]
    events = list(client.responses.create(model="toolie", input="Weather in Paris?", tools=tools,
                                          stream=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    items = [e.item for e in events if e.type == "response.output_item.done"]
    assert [json.loads(e.arguments) for e in done] == [CALL["arguments"]]
    assert [json.loads(i.arguments) for i in items] == [CALL["arguments"]]  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_tool_arguments_are_the_object_streamed_and_not(url: str, stream: bool) -> None:
    body = {"model": "toolie", "messages": HI, "tools": TOOLS, "stream": stream, "think": False}
    r = httpx.post(url + "/api/chat", json=body, timeout=60)
    assert r.status_code == 200
    lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
    calls = [c for line in lines for c in line["message"].get("tool_calls", [])]
    assert len(calls) == 1 and calls[0]["function"]["arguments"] == CALL["arguments"]
    assert calls[0]["id"].startswith("call_")
    for arguments in (CALL["arguments"], json.dumps(CALL["arguments"])):  # history in either form
        history = [*HI, {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "tool_name": "get_weather", "content": "sunny"}]
        r = httpx.post(url + "/api/chat", json={**body, "messages": history, "stream": False}, timeout=60)
        assert r.status_code == 200 and r.json()["message"]["content"] == REPLY


STREAMS = {
    "/api/chat": {"messages": HI}, "/api/generate": {"prompt": "hi"},
    "/v1/chat/completions": {"messages": HI, "stream": True},
    "/v1/completions": {"prompt": "hi", "stream": True},
    "/v1/messages": {"messages": HI, "max_tokens": 20, "stream": True},
    "/v1/responses": {"input": "hi", "stream": True},
}


@pytest.mark.parametrize("path", list(STREAMS))
def test_every_streamed_answer_tells_proxies_not_to_buffer_it(url: str, path: str) -> None:
    with httpx.stream("POST", url + path, json={"model": "ticker", **STREAMS[path]}, timeout=60) as r:
        r.read()
    assert r.status_code == 200
    assert r.headers["x-accel-buffering"] == "no" and r.headers["cache-control"] == "no-cache"
    assert len(r.headers.get_list("cache-control")) == 1
