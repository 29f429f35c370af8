"""Ollama capability errors (on the Ollama and the /v1 routes, each in its dialect's shape), /api/show
parameters, CORS and the Host guard, the OpenAI and Anthropic request checks through the routes, the
forced-tool path of /v1/messages, and a fuzz of malformed shapes: pure functions table-tested, then the
same rules through the in-process app (fake llama-server children; capability errors, bad bodies and
CORS refusals are answered before any child starts)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conformance.fuzz import anthropic_bodies, embedding_bodies, openai_chat_bodies
from tests.fakes.inprocess import InProcessApp
from tests.unit.ggufgen import TOOLS_THINK_TEMPLATE, write_gguf

from llmman.api.cors import DEFAULT_ORIGINS, host_allowed, origin_allowed, origin_patterns
from llmman.config.table import split_list
from llmman.errors import BadRequest
from llmman.gguf import read_gguf
from llmman.protocol.capabilities import (
    anthropic_needs,
    capability_error,
    check_capabilities,
    openai_chat_needs,
    required_capabilities,
    responses_needs,
)
from llmman.protocol.framing import SSEDecoder
from llmman.protocol.ollama.show import parameters_text, stop_tokens
from llmman.refs import parse_reference

IMAGE = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]


@pytest.mark.parametrize(
    ("body", "think", "needed"),
    [
        ({"messages": []}, None, ("completion",)),
        ({"messages": [], "tools": [{"type": "function"}]}, None, ("completion", "tools")),
        ({"messages": [], "tools": []}, None, ("completion",)),
        ({"messages": []}, True, ("completion", "thinking")),
        ({"messages": []}, "low", ("completion", "thinking")),
        ({"messages": []}, False, ("completion",)),
        ({"messages": IMAGE}, None, ("completion", "vision")),
        ({"messages": [{"role": "user", "content": "hi"}]}, None, ("completion",)),
    ],
)
def test_required_capabilities(body: dict[str, object], think: bool | str | None,
                               needed: tuple[str, ...]) -> None:  # fmt: skip
    assert required_capabilities(body, think) == needed


@pytest.mark.parametrize(
    ("kind", "needed", "have", "message"),
    [
        ("chat", ("completion", "tools"), ("completion", "tools"), None),
        ("chat", ("completion", "tools"), ("completion",), "m:1 does not support tools"),
        ("chat", ("completion", "thinking"), ("completion",), '"m:1" does not support thinking'),
        ("chat", ("completion", "vision"), ("completion", "tools"), "m:1 does not support vision"),
        ("chat", ("completion",), ("embedding",), '"m:1" does not support chat'),
        ("generate", ("completion", "tools"), ("embedding",), '"m:1" does not support generate'),
    ],
)
def test_capability_error_wording(kind: str, needed: tuple[str, ...], have: tuple[str, ...],
                                  message: str | None) -> None:  # fmt: skip
    assert capability_error("m:1", kind, needed, have) == message  # type: ignore[arg-type]


def test_check_capabilities_raises_400() -> None:
    with pytest.raises(BadRequest) as err:
        check_capabilities("m", "chat", {"tools": [{}]}, None, ("completion",))
    assert err.value.status == 400 and err.value.message == "m does not support tools"
    check_capabilities("m", "chat", {"tools": [{}]}, False, ("completion", "tools"))


@pytest.mark.parametrize(
    ("origin", "extra", "allowed"),
    [
        ("http://localhost", "", True),
        ("http://localhost:3000", "", True),
        ("https://127.0.0.1:8443", "", True),
        ("http://0.0.0.0:8080", "", True),
        ("vscode-webview://abc", "", True),
        ("app://obsidian.md", "", True),
        ("http://evil.example", "", False),
        ("http://localhost.evil.example", "", False),
        ("chrome-extension://abcdef", "", False),
        ("chrome-extension://abcdef", "chrome-extension://*", True),
        ("https://chat.example.com", "https://*.example.com, http://x", True),
        ("https://example.com.evil", "https://*.example.com", False),
        ("http://anything", "*", True),
    ],
)
def test_origin_allowed(origin: str, extra: str, allowed: bool) -> None:
    assert origin_allowed(origin, origin_patterns(split_list(extra))) is allowed


def test_default_origins_are_ollamas() -> None:
    assert len(DEFAULT_ORIGINS) == 17 and "https://0.0.0.0:*" in DEFAULT_ORIGINS


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:17434", True), ("[::1]:17434", True), ("localhost:17434", True), ("", True),
        ("192.168.1.5:17434", True), ("10.0.0.1", True), ("0.0.0.0:1", True), ("box:80", True),
        ("app.localhost", True), ("printer.local:631", True), ("svc.internal", True), ("BOX", True),
        ("203.0.113.9", True),  # a local interface address
        ("evil.example:17434", False), ("8.8.8.8", False), ("localhost.evil.example", False),
    ],
)
def test_host_allowed(host: str, allowed: bool) -> None:
    assert host_allowed(host, hostname="box", local_ips={"203.0.113.9"}) is allowed


def test_stop_tokens_and_parameters(tmp_path: Path) -> None:
    info = read_gguf(write_gguf(tmp_path / "m.gguf", vocab=300, extra={
        "tokenizer.ggml.eos_token_id": 7, "tokenizer.ggml.eot_token_id": 9, "tokenizer.ggml.bos_token_id": 1,
    }))  # fmt: skip
    assert stop_tokens(info) == ["tok7", "tok9"]
    text = parameters_text(2048, stop_tokens(info))
    assert text.splitlines() == [f"{'num_ctx':<30} 2048", f"{'stop':<30} \"tok7\"", f"{'stop':<30} \"tok9\""]
    bare = read_gguf(write_gguf(tmp_path / "bare.gguf", extra={"tokenizer.ggml.eos_token_id": 7}))
    assert stop_tokens(bare) == []


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> InProcessApp:
    with InProcessApp(tmp_path_factory.mktemp("fidelity"),
                      env={"LLMMAN_ORIGINS": "chrome-extension://*"}) as running:  # fmt: skip
        yield running  # type: ignore[misc]


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                       "tools": [{"type": "function", "function": {"name": "f"}}]},
         "tiny does not support tools"),
        ("/api/chat", {"model": "tiny", "messages": [], "think": True}, '"tiny" does not support thinking'),
        ("/api/generate", {"model": "tiny", "prompt": "x", "think": "high"},
         '"tiny" does not support thinking'),
        ("/api/generate", {"model": "tiny", "prompt": "x", "images": ["iVBORw0KGgo="]},
         "tiny does not support vision"),
    ],
)
def test_capability_errors_in_ollama_shape(app: InProcessApp, path: str, body: dict[str, object],
                                           message: str) -> None:  # fmt: skip
    r = app.post(path, json=body)
    assert (r.status_code, r.json()) == (400, {"error": message})
    assert app.loaded_pids() == []


def test_show_verbose_must_be_a_boolean(app: InProcessApp) -> None:
    """Ollama's ``verbose`` is a Go bool: any other JSON value is a 400, not ignored."""
    for verbose in ("x", 1, [True]):
        r = app.post("/api/show", json={"model": "tiny", "verbose": verbose})
        assert (r.status_code, r.json()) == (400, {"error": "verbose must be a boolean"})
    for ok in (True, False, None):
        assert app.post("/api/show", json={"model": "tiny", "verbose": ok}).status_code == 200


def test_retrieve_one_model(app: InProcessApp) -> None:
    """``GET /v1/models/{id}`` (openai ``models.retrieve``): the id as sent, slashes and colons included;
    OpenAI's 404 for a model the store lacks, without loading anything."""
    listed = app.request("GET", "/v1/models").json()["data"][0]
    for name in (listed["id"], "tiny"):
        r = app.request("GET", f"/v1/models/{name}")
        assert r.status_code == 200 and r.json() == {**listed, "id": name}
    for missing in ("nope", "docker.io/ai/nope:1b", "bad::name"):
        r = app.request("GET", f"/v1/models/{missing}")
        assert r.status_code == 404
        assert r.json() == {"error": {"message": f"model '{missing}' not found", "type": "not_found_error",
                                      "param": None, "code": "model_not_found"}}  # as the other /v1 routes
    assert app.loaded_pids() == []


def test_cors_preflight_allowed_and_refused(app: InProcessApp) -> None:
    pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    ok = app.request("OPTIONS", "/api/chat", headers={"Origin": "http://localhost:3000", **pre})
    assert ok.status_code == 204 and ok.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "Content-Type" in ok.headers["access-control-allow-headers"]
    assert "POST" in ok.headers["access-control-allow-methods"]
    ext = app.request("GET", "/api/version", headers={"Origin": "chrome-extension://abc"})
    assert ext.status_code == 200 and ext.headers["access-control-allow-origin"] == "chrome-extension://abc"
    assert "Origin" in ext.headers["vary"]
    bad = app.request("OPTIONS", "/api/chat", headers={"Origin": "http://evil.example", **pre})
    assert bad.status_code == 403 and "access-control-allow-origin" not in bad.headers
    bad_v1 = app.request("GET", "/v1/models", headers={"Origin": "http://evil.example"})
    assert bad_v1.status_code == 403 and bad_v1.json()["error"]["message"].startswith("origin")
    plain = app.request("GET", "/api/version")
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


def test_host_guard_blocks_dns_rebinding(app: InProcessApp) -> None:
    r = app.request("GET", "/api/tags", headers={"Host": "attacker.example:17434"})
    assert (r.status_code, r.json()) == (403, {"error": "host attacker.example:17434 not allowed"})
    assert app.request("GET", "/api/tags", headers={"Host": "127.0.0.1:17434"}).status_code == 200
    same_origin = app.request("GET", "/api/tags", headers={"Host": "attacker.example",
                                                           "Origin": "http://attacker.example"})
    assert same_origin.status_code == 403  # not a CORS request, but still a foreign Host


def test_host_guard_off_when_bound_off_loopback(tmp_path: Path) -> None:
    with InProcessApp(tmp_path, env={"LLMMAN_HOST": "0.0.0.0:1", "LLMMAN_AUTH": "off"}) as wide:
        r = wide.request("GET", "/api/tags", headers={"Host": "models.example.org"})
        assert r.status_code == 200


def test_show_reports_parameters_and_capabilities(app: InProcessApp) -> None:
    r = app.post("/api/show", json={"model": "tiny"}).json()
    assert r["capabilities"] == ["completion"] and "<|im_start|>" in r["template"]
    assert r["parameters"].splitlines()[0].split() == ["num_ctx", "2048"]
    assert r["model_info"]["llama.context_length"] == 2048


# --------------------------------------------------------------------------- the /v1 routes' checks
TOOLS = [{"type": "function", "function": {"name": "f"}}]


@pytest.mark.parametrize(
    ("body", "needed"),
    [
        ({"messages": []}, ("completion",)),
        ({"messages": [], "tools": TOOLS}, ("completion", "tools")),
        ({"messages": [], "tools": []}, ("completion",)),
        ({"messages": [], "reasoning_effort": "high"}, ("completion", "thinking")),
        ({"messages": [], "reasoning_effort": "none"}, ("completion",)),
        ({"messages": [], "reasoning": {"effort": "low"}}, ("completion", "thinking")),
        ({"messages": IMAGE, "tools": TOOLS}, ("completion", "tools", "vision")),
    ],
)
def test_openai_chat_needs(body: dict[str, object], needed: tuple[str, ...]) -> None:
    assert openai_chat_needs(body) == needed


ANTHROPIC_IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}


@pytest.mark.parametrize(
    ("body", "needed"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, ("completion",)),
        ({"messages": [], "tools": [{"name": "f"}]}, ("completion", "tools")),
        ({"messages": [{"role": "user", "content": [ANTHROPIC_IMAGE]}]}, ("completion", "vision")),
        ({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [ANTHROPIC_IMAGE]}]}]},
         ("completion", "vision")),
        # relaxed, never needed:
        ({"messages": [], "thinking": {"type": "enabled", "budget_tokens": 2048}}, ("completion",)),
    ],
)
def test_anthropic_needs(body: dict[str, object], needed: tuple[str, ...]) -> None:
    assert anthropic_needs(body) == needed


@pytest.mark.parametrize(
    ("body", "needed"),
    [
        ({"input": "x"}, ("completion",)),
        ({"input": "x", "tools": TOOLS, "reasoning": {"effort": "high"}}, ("completion", "tools")),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
         ("completion", "vision")),
    ],
)
def test_responses_needs(body: dict[str, object], needed: tuple[str, ...]) -> None:
    assert responses_needs(body) == needed


AGENT = "agent"
EMBEDDER = "embedder"


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessApp]:
    """tiny (completion only), agent (tools and thinking; its fake answers the forced tool's JSON) and
    embedder (an embedding model)."""
    reply = json.dumps({AGENT: {"FAKE_REPLY": '{"city": "Pärïs"}'}})
    with InProcessApp(tmp_path_factory.mktemp("routes"), env={"FAKE_PER_MODEL": reply}) as app:
        root = Path(app.root)
        app.store.build(parse_reference(AGENT), write_gguf(root / "gguf" / "agent.gguf",
                                                             chat_template=TOOLS_THINK_TEMPLATE))
        app.store.build(parse_reference(EMBEDDER), write_gguf(root / "gguf" / "embedder.gguf",
                                                                extra={"llama.pooling_type": 1}))
        yield app


def _openai_400(message: str, param: str | None) -> dict[str, object]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"content": "x"}]}, "messages[0].role",
         "Missing required parameter: 'messages[0].role'."),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                  "tools": [{"type": "function"}]}, "tools[0].function",
         "Missing required parameter: 'tools[0].function'."),
        ("/v1/chat/completions", {"model": "nope", "messages": "x"}, "messages",  # 400 before the 404
         "Invalid type for 'messages': expected an array, but got a string instead."),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                  "temperature": "hot"}, "temperature",
         "Invalid type for 'temperature': expected a number, but got a string instead."),
        ("/v1/completions", {"model": "tiny", "prompt": {"a": 1}}, "prompt",
         "Invalid type for 'prompt': expected one of a string, array of strings, array of integers, or array "
         "of arrays of integers, but got an object instead."),
        ("/v1/embeddings", {"model": "tiny", "input": "x", "dimensions": 0}, "dimensions",
         "Invalid 'dimensions': integer below minimum value. Expected a value >= 1, but got 0 instead."),
        ("/v1/embeddings", {"model": "tiny", "input": "x", "dimensions": -3}, "dimensions",
         "Invalid 'dimensions': integer below minimum value. Expected a value >= 1, but got -3 instead."),
    ],
)
def test_openai_bad_bodies_are_openai_400s(routes: InProcessApp, path: str, body: dict[str, object],
                                           param: str, message: str) -> None:  # fmt: skip
    r = routes.post(path, json=body)
    assert (r.status_code, r.json()) == (400, _openai_400(message, param))
    assert routes.loaded_pids() == []


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                  "tools": TOOLS}, "tiny does not support tools"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                  "reasoning_effort": "high"}, '"tiny" does not support thinking'),
        ("/v1/chat/completions", {"model": "tiny", "messages": IMAGE}, "tiny does not support vision"),
        ("/v1/chat/completions", {"model": EMBEDDER, "messages": [{"role": "user", "content": "x"}]},
         f'"{EMBEDDER}" does not support chat'),
        ("/v1/completions", {"model": EMBEDDER, "prompt": "x"}, f'"{EMBEDDER}" does not support generate'),
        ("/v1/responses", {"model": "tiny", "input": "x", "tools": [
            {"type": "function", "name": "f", "parameters": {}}]}, "tiny does not support tools"),
        ("/v1/responses", {"model": EMBEDDER, "input": "x"}, f'"{EMBEDDER}" does not support chat'),
    ],
)
def test_capability_errors_in_openai_shape(routes: InProcessApp, path: str, body: dict[str, object],
                                           message: str) -> None:  # fmt: skip
    r = routes.post(path, json=body)
    assert (r.status_code, r.json()) == (400, _openai_400(message, None))
    assert routes.loaded_pids() == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
          "tools": [{"name": "f", "input_schema": {"type": "object"}}]}, "tiny does not support tools"),
        ({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": [ANTHROPIC_IMAGE]}]},
         "tiny does not support vision"),
        ({"model": EMBEDDER, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
         f'"{EMBEDDER}" does not support chat'),
        ({"model": "tiny", "messages": [{"role": "user", "content": "x"}]}, "max_tokens: Field required"),
        ({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
         "messages.0.content.0.text: Field required"),
        ({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
          "stop_sequences": "x"}, "stop_sequences: Input should be a valid list"),
        ({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
          "system": [{"a": 1}]}, "system.0.type: Input should be a valid string (one of 'text')"),
    ],
)
def test_anthropic_errors_in_anthropic_shape(routes: InProcessApp, body: dict[str, object],
                                             message: str) -> None:  # fmt: skip
    r = routes.post("/v1/messages", json=body)
    assert (r.status_code, r.json()) == (400, {"type": "error", "error": {
        "type": "invalid_request_error", "message": message}})
    assert routes.loaded_pids() == []


def test_embed_dimensions_in_ollama_shape(routes: InProcessApp) -> None:
    for dims in (0, -1):
        r = routes.post("/api/embed", json={"model": "tiny", "input": "x", "dimensions": dims})
        assert (r.status_code, r.json()) == (400, {"error": "dimensions must be a positive integer"})


WEATHER = {"name": "get_weather", "description": "Weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    return [(e.event or "", json.loads(e.data)) for e in SSEDecoder().feed(raw)]


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_goes_through_the_chat_route(routes: InProcessApp, stream: bool) -> None:
    """The agent's fake child answers the grammar-constrained JSON; llmman turns it into a tool_use."""
    r = routes.post("/v1/messages", json={
        "model": AGENT, "max_tokens": 32, "stream": stream, "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": "Weather in Paris?"}]})
    assert r.status_code == 200, r.text
    if not stream:
        msg = r.json()
        assert msg["stop_reason"] == "tool_use" and msg["model"] == AGENT and msg["id"].startswith("msg_")
        assert msg["content"] == [{"type": "tool_use", "id": msg["id"].replace("msg_", "toolu_", 1),
                                   "name": "get_weather", "input": {"city": "Pärïs"}}]
        return
    events = _sse_events(r.content)
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert json.loads(partial) == {"city": "Pärïs"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


FUZZED = [("/v1/messages", anthropic_bodies), ("/v1/messages/count_tokens", anthropic_bodies),
          ("/v1/chat/completions", openai_chat_bodies), ("/v1/embeddings", embedding_bodies),
          ("/api/embed", embedding_bodies)]


@pytest.mark.parametrize(("path", "strategy"), FUZZED)
def test_malformed_shapes_are_400s_never_500s(routes: InProcessApp, path: str,
                                              strategy: Callable[[str], st.SearchStrategy[bytes]]) -> None:
    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(body=strategy("tiny") | strategy(AGENT))
    def run(body: bytes) -> None:
        r = routes.post(path, content=body, headers={"content-type": "application/json"})
        text = r.content.decode("utf-8", "replace")
        assert r.status_code < 500 and "Traceback" not in text, text
        if r.status_code == 400:
            err = r.json()
            if path.startswith("/v1/messages"):
                assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", text
            elif path.startswith("/v1/"):
                assert err["error"]["type"] == "invalid_request_error" and err["error"]["code"] is None, text
            else:
                assert isinstance(err["error"], str), text

    run()
