"""Ollama capability errors, /api/show parameters, CORS and the Host guard: pure functions table-tested,
then the same rules through the in-process app (fake llama-server children; capability errors and
CORS refusals are answered before any child starts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.fakes.inprocess import InProcessApp
from tests.unit.ggufgen import write_gguf

from llmman.api.cors import DEFAULT_ORIGINS, host_allowed, origin_allowed, origin_patterns
from llmman.errors import BadRequest
from llmman.gguf import read_gguf
from llmman.protocol.capabilities import capability_error, check_capabilities, required_capabilities
from llmman.protocol.show import parameters_text, stop_tokens

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
    assert origin_allowed(origin, origin_patterns(extra)) is allowed


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
