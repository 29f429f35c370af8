"""The HTTP surface in-process: ``build_app(Services)`` with a real store, scheduler and gateway whose
llama-server children are the fake (tests/fakes/fake_llama_server.py).

Covers routing errors, ``stream:false`` aggregation, ``keep_alive`` forms, load/unload requests,
UTF-8 that arrives split inside a character, and a hypothesis fuzz of every body-taking route.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.fakes.inprocess import InProcessApp
from tests.unit.ggufgen import write_gguf

from llmman.cli.tables import format_until
from llmman.refs import parse_reference

pytestmark = pytest.mark.timeout(120)

REPLY = "Grüße 日本語 🙂 ok"
WORDS = ["Grüße", " 日本語", " 🙂", " ok"]
MODEL = "tiny"
MODEL_REF = "docker.io/ai/tiny:latest"


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessApp]:
    """One app for the module; the fake answers REPLY and cuts every event inside a character."""
    env = {"FAKE_REPLY": REPLY, "FAKE_SPLIT_BYTES": "1", "LLMMAN_KEEP_ALIVE": "5m"}
    with InProcessApp(tmp_path_factory.mktemp("app"), env=env) as a:
        yield a


@pytest.fixture()
def unloaded(app: InProcessApp) -> Iterator[InProcessApp]:
    """The module app, with nothing loaded before and after the test."""
    app.call(app.scheduler.unload(MODEL_REF))
    yield app
    app.call(app.scheduler.unload(MODEL_REF))


def ndjson_lines(resp: httpx.Response) -> list[dict[str, Any]]:
    assert resp.content.endswith(b"\n")
    return [json.loads(line) for line in resp.content.split(b"\n") if line]


def sse_data(raw: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body, decoded from the raw bytes as a whole."""
    text = raw.decode("utf-8")  # strict: a character torn by llmman would raise here
    return [line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: ")]


def expires_in(entry: dict[str, Any]) -> float:
    expires = datetime.fromisoformat(str(entry["expires_at"]))
    return (expires - datetime.now(expires.tzinfo)).total_seconds()


# ------------------------------------------------------------------------------------------- routing
def test_root_answers_get_and_head(app: InProcessApp) -> None:
    got = app.request("GET", "/")
    head = app.request("HEAD", "/")
    assert (got.status_code, got.text) == (200, "Ollama is running")
    assert head.status_code == 200
    assert head.content == b""


@pytest.mark.parametrize("path", ["/nope", "/api/nope", "/api/chat/extra"])
def test_unknown_ollama_path_is_a_json_404(app: InProcessApp, path: str) -> None:
    resp = app.request("GET", path)
    assert resp.status_code == 404
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json() == {"error": f"GET {path} not found"}


def test_unknown_openai_path_is_an_openai_404(app: InProcessApp) -> None:
    resp = app.request("POST", "/v1/embeddings-nope", json={})
    assert resp.status_code == 404
    err = resp.json()["error"]
    assert err["type"] == "not_found_error"
    assert "/v1/embeddings-nope" in err["message"]


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/api/chat"), ("GET", "/api/generate"), ("POST", "/api/tags"), ("GET", "/api/delete"),
     ("PUT", "/"), ("POST", "/api/ps")],
)  # fmt: skip
def test_wrong_method_is_a_json_405(app: InProcessApp, method: str, path: str) -> None:
    resp = app.request(method, path)
    assert resp.status_code == 405
    assert resp.json() == {"error": f"method {method} not allowed for {path}"}


def test_wrong_method_on_openai_route_is_an_openai_405(app: InProcessApp) -> None:
    resp = app.request("GET", "/v1/chat/completions")
    assert resp.status_code == 405
    assert isinstance(resp.json()["error"]["message"], str)


# --------------------------------------------------------------------------------- stream: false
def test_chat_stream_false_is_one_object_with_the_whole_answer(app: InProcessApp) -> None:
    body = {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    resp = app.post("/api/chat", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    obj = json.loads(resp.content)  # exactly one JSON document: NDJSON with 2+ lines would not parse
    assert isinstance(obj, dict)
    assert obj["message"] == {"role": "assistant", "content": REPLY}
    assert (obj["done"], obj["done_reason"]) == (True, "stop")
    assert obj["eval_count"] == len(WORDS)
    assert obj["model"] == MODEL


def test_generate_stream_false_is_one_object_with_the_whole_answer(app: InProcessApp) -> None:
    resp = app.post("/api/generate", json={"model": MODEL, "prompt": "hi", "stream": False})
    assert resp.status_code == 200, resp.text
    obj = json.loads(resp.content)
    assert obj["response"] == REPLY
    assert (obj["done"], obj["done_reason"]) == (True, "stop")


@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
def test_num_predict_stops_with_done_reason_length(app: InProcessApp, route: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "stream": False, "options": {"num_predict": 2}}
    body.update({"messages": HI} if route == "/api/chat" else {"prompt": "hi"})
    obj = app.post(route, json=body).json()
    text = obj["message"]["content"] if route == "/api/chat" else obj["response"]
    assert text == "".join(WORDS[:2])
    assert obj["done_reason"] == "length"
    assert obj["eval_count"] == 2


def test_streaming_chat_has_one_done_line_and_the_whole_text(app: InProcessApp) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    resp = app.post("/api/chat", json=body)
    assert resp.headers["content-type"].startswith("application/x-ndjson")
    lines = ndjson_lines(resp)
    assert [line["done"] for line in lines].count(True) == 1 and lines[-1]["done"]
    assert "".join(line["message"]["content"] for line in lines) == REPLY
    assert lines[-1]["done_reason"] == "stop"


# ------------------------------------------------------------------------------------------ UTF-8
def test_openai_streaming_passes_split_characters_through_intact(app: InProcessApp) -> None:
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    resp = app.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200
    assert "\ufffd".encode() not in resp.content
    events = sse_data(resp.content)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == REPLY


def test_openai_non_streaming_keeps_multibyte_text(app: InProcessApp) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    resp = app.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"] == REPLY
    assert REPLY.encode() in resp.content  # raw UTF-8 from llama-server, passed through unchanged


def test_openai_text_completion_streams_intact(app: InProcessApp) -> None:
    resp = app.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "stream": True})
    events = sse_data(resp.content)
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert text == REPLY


# ------------------------------------------------------------------------------ keep_alive, load
@pytest.mark.parametrize(("keep_alive", "low", "high"), [(120, 60, 121), ("10m", 540, 601), (90.5, 30, 91)])
def test_keep_alive_sets_the_expiry(unloaded: InProcessApp, keep_alive: object, low: float,
                                    high: float) -> None:  # fmt: skip
    resp = unloaded.post("/api/generate", json={"model": MODEL, "keep_alive": keep_alive})
    assert resp.status_code == 200
    assert resp.json()["done_reason"] == "load"
    (entry,) = unloaded.ps()
    assert entry["name"] == MODEL_REF and entry["processor"] == "llama-server"
    assert low < expires_in(entry) <= high


@pytest.mark.parametrize("keep_alive", [-1, "-1m", "-1"])
def test_negative_keep_alive_keeps_the_model_forever(unloaded: InProcessApp, keep_alive: object) -> None:
    resp = unloaded.post("/api/chat", json={"model": MODEL, "messages": [], "keep_alive": keep_alive})
    assert resp.json()["done_reason"] == "load"
    assert resp.json()["message"] == {"role": "assistant", "content": ""}
    (entry,) = unloaded.ps()
    assert expires_in(entry) > 200 * 365 * 86400
    assert format_until(entry["expires_at"], datetime.now().astimezone()) == "Forever"
    (snap,) = unloaded.scheduler.snapshot()
    assert snap.expires_at is None


def test_a_request_keep_alive_overrides_the_loaded_one(unloaded: InProcessApp) -> None:
    unloaded.post("/api/generate", json={"model": MODEL, "keep_alive": -1})
    body = {"model": MODEL, "prompt": "hi", "stream": False, "keep_alive": "10m"}
    assert unloaded.post("/api/generate", json=body).json()["done_reason"] == "stop"
    (entry,) = unloaded.ps()
    assert 540 < expires_in(entry) <= 601


@pytest.mark.parametrize("route", ["/api/generate", "/api/chat"])
def test_keep_alive_zero_unloads_and_the_child_exits(unloaded: InProcessApp, route: str) -> None:
    load = unloaded.post(route, json={"model": MODEL})
    assert load.json()["done_reason"] == "load"
    (pid,) = unloaded.loaded_pids()
    resp = unloaded.post(route, json={"model": MODEL, "keep_alive": 0})
    assert resp.status_code == 200
    assert resp.json()["done_reason"] == "unload"
    assert unloaded.ps() == []
    assert not psutil.pid_exists(pid)


def test_unload_of_a_model_not_loaded_is_ok(unloaded: InProcessApp) -> None:
    resp = unloaded.post("/api/generate", json={"model": MODEL, "keep_alive": 0})
    assert resp.status_code == 200
    assert resp.json()["done_reason"] == "unload"
    assert unloaded.ps() == []


@pytest.mark.parametrize("route", ["/api/generate", "/api/chat"])
def test_unload_of_an_unknown_model_is_404(app: InProcessApp, route: str) -> None:
    resp = app.post(route, json={"model": "nope:1b", "keep_alive": 0})
    assert resp.status_code == 404
    assert resp.json() == {"error": "model 'nope:1b' not found"}


@pytest.mark.parametrize("keep_alive", ["abc", "1d", True, [1], {"m": 5}])
def test_invalid_keep_alive_is_a_400(app: InProcessApp, keep_alive: object) -> None:
    resp = app.post("/api/generate", json={"model": MODEL, "keep_alive": keep_alive})
    assert resp.status_code == 400
    assert isinstance(resp.json()["error"], str)


def test_empty_prompt_generate_answers_load_with_an_empty_response(unloaded: InProcessApp) -> None:
    resp = unloaded.post("/api/generate", json={"model": MODEL, "prompt": ""})
    obj = resp.json()
    assert (obj["response"], obj["done"], obj["done_reason"]) == ("", True, "load")
    (entry,) = unloaded.ps()
    assert entry["pid"] in unloaded.loaded_pids()


# ------------------------------------------------------------------------------------------ fuzz
OLLAMA_ROUTES = [("POST", "/api/chat"), ("POST", "/api/generate"), ("POST", "/api/show"),
                 ("DELETE", "/api/delete"), ("POST", "/api/copy")]  # fmt: skip
OPENAI_ROUTES = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions")]

NAMES = st.sampled_from([MODEL, f"{MODEL}:latest", MODEL_REF, "TINY", "nope", "", " ", "tiny:", ":latest",
                         "a/b/c/d/e", "../../etc/passwd", "x" * 300, "hf.co/u/r:Q4_K_M", "tiny@sha256:00",
                         "ünï:cødé", "tiny:../x", "-", "sha256:" + "0" * 64])  # fmt: skip
SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False) | st.text(max_size=20))  # fmt: skip
JUNK = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)  # fmt: skip
KEEP_ALIVE = st.sampled_from([0, -1, 1, "5m", "0", "-1m", "1h30m", "abc", "1d", "", 1e308, -1e308, 2**64,
                              "9999999999999h", "1e400"]) | JUNK  # fmt: skip
OPTION_KEYS = st.sampled_from(["num_predict", "temperature", "top_k", "stop", "num_ctx", "seed", "use_mmap",
                               "num_keep", "tfs_z", "mirostat"])  # fmt: skip
OPTIONS = st.dictionaries(OPTION_KEYS, JUNK | st.integers(min_value=-3, max_value=3), max_size=3) | JUNK
MESSAGE = st.fixed_dictionaries(
    {},
    optional={"role": st.sampled_from(["user", "system", "assistant", "tool", "USER", ""]) | JUNK,
              "content": st.text(max_size=20) | JUNK, "images": JUNK, "tool_calls": JUNK,
              "thinking": JUNK, "tool_name": JUNK},
)  # fmt: skip
MESSAGES = st.lists(MESSAGE | JUNK, max_size=3) | JUNK
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": NAMES | JUNK, "name": NAMES | JUNK, "messages": MESSAGES, "prompt": st.text(max_size=20) | JUNK,
    "options": OPTIONS, "stream": st.booleans() | JUNK, "format": st.sampled_from(["json", "", "xml"]) | JUNK,
    "keep_alive": KEEP_ALIVE, "think": st.sampled_from([True, False, "low", "max", "huge"]) | JUNK,
    "system": JUNK, "template": JUNK, "raw": JUNK, "images": JUNK, "suffix": JUNK, "context": JUNK,
    "logprobs": JUNK, "top_logprobs": JUNK, "tools": JUNK, "verbose": JUNK, "source": NAMES | JUNK,
    "destination": NAMES | JUNK, "max_tokens": JUNK, "n_predict": JUNK, "stream_options": JUNK,
}  # fmt: skip
HI = [{"role": "user", "content": "hi"}]
VALID: dict[str, dict[str, Any]] = {
    "/api/chat": {"model": MODEL, "messages": HI, "stream": False},
    "/api/generate": {"model": MODEL, "prompt": "hi", "stream": False},
    "/api/show": {"model": MODEL},
    "/api/delete": {"model": MODEL},
    "/api/copy": {"source": MODEL, "destination": "copy:1"},
    "/v1/chat/completions": {"model": MODEL, "messages": HI},
    "/v1/completions": {"model": MODEL, "prompt": "hi"},
}


def mutated(base: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """``base`` (a valid body) with up to three fields replaced or added and maybe one removed."""
    changes = st.lists(st.sampled_from(sorted(FIELDS)), max_size=3, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: FIELDS[k] for k in keys})
    )
    drops = st.sets(st.sampled_from(sorted(base)), max_size=1)

    def build(change: dict[str, Any], drop: set[str]) -> bytes:
        body = {k: v for k, v in base.items() if k not in drop}
        return json.dumps({**body, **change}).encode()

    return st.builds(build, changes, drops)


def bodies(path: str) -> st.SearchStrategy[bytes]:
    """Mostly near-valid bodies (deep paths), some arbitrary objects, some broken bytes."""
    anything = st.fixed_dictionaries({}, optional=FIELDS).map(lambda d: json.dumps(d).encode())
    return st.one_of(mutated(VALID[path]), mutated(VALID[path]), anything, RAW_BODIES)

RAW_BODIES = st.sampled_from([
    b"", b" ", b"null", b"[]", b"1", b'"x"', b"{", b'{"model": "tiny"',
    b'{"model": "tiny", "prompt": "\xff"}',
    b'{"model": "tin\xc3"}', b"\xef\xbb\xbf{}", b'{"model": NaN}', b'{"model": "tiny", "prompt": 1e999}',
    b'{"model": "tiny", "options": {"num_predict": 99999999999999999999999}}', b"\x00\x01\x02",
    b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"model":"tiny","messages":[' * 200,
]) | st.binary(max_size=40)  # fmt: skip
FUZZ = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessApp]:
    """A separate app for the fuzz (it deletes and copies models; keep_alive 0 unloads)."""
    with InProcessApp(tmp_path_factory.mktemp("fuzz"), env={"FAKE_REPLY": "ok fine"}) as a:
        yield a


def _ensure_model(app: InProcessApp) -> None:
    """Put the model back if a fuzzed DELETE (or a copy over it) removed it."""
    if app.store.find(parse_reference(MODEL)) is None:
        gguf = write_gguf(Path(app.root) / "gguf" / "again.gguf", name="Tiny again")
        app.store.build(parse_reference(MODEL), gguf)


def check_answer(resp: httpx.Response, openai: bool) -> None:
    """No 5xx, no traceback, and errors in the route's dialect."""
    text = resp.content.decode("utf-8", "replace")
    assert resp.status_code < 500, text
    assert "Traceback" not in text
    if resp.status_code >= 400:
        err = resp.json()["error"]
        if openai:
            assert isinstance(err, dict) and isinstance(err["message"], str), text
        else:
            assert isinstance(err, str), text
    elif resp.headers.get("content-type", "").startswith("application/x-ndjson"):
        for line in ndjson_lines(resp):
            assert "error" not in line, text
    elif resp.headers.get("content-type", "").startswith("text/event-stream"):
        assert '"error"' not in text, text


@pytest.mark.parametrize(("method", "path"), OLLAMA_ROUTES)
def test_fuzzed_bodies_never_5xx_on_ollama_routes(fuzz_app: InProcessApp, method: str, path: str) -> None:
    @FUZZ
    @given(body=bodies(path))
    def run(body: bytes) -> None:
        try:
            resp = fuzz_app.request(method, path, content=body, headers={"content-type": "application/json"})
            check_answer(resp, openai=False)
        finally:
            _ensure_model(fuzz_app)

    run()


@pytest.mark.parametrize(("method", "path"), OPENAI_ROUTES)
def test_fuzzed_bodies_never_5xx_on_openai_routes(fuzz_app: InProcessApp, method: str, path: str) -> None:
    @FUZZ
    @given(body=bodies(path))
    def run(body: bytes) -> None:
        resp = fuzz_app.request(method, path, content=body, headers={"content-type": "application/json"})
        check_answer(resp, openai=True)

    run()


def test_fuzz_reaches_the_model(fuzz_app: InProcessApp) -> None:
    """The fuzz strategies can produce a valid request, so the success path is exercised too."""
    _ensure_model(fuzz_app)
    resp = fuzz_app.post("/api/generate", content=json.dumps({"model": MODEL, "prompt": "x"}).encode())
    assert resp.status_code == 200
    assert "".join(line.get("response", "") for line in ndjson_lines(resp)) == "ok fine"
