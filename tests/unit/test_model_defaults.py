"""Derived models: the request-time merge (pure), the show text, and the store layers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.fakes.inprocess import make_store

from llmman.errors import ModelNotFound
from llmman.protocol.model_defaults import (
    ModelDefaults,
    apply_chat,
    apply_generate,
    apply_openai_chat,
    generate_messages,
    merge_options,
)
from llmman.protocol.ollama.request import chat_request, generate_request
from llmman.protocol.ollama.show import modelfile_extras, options_text, parameters_text
from llmman.refs import parse_reference
from llmman.store import derive_model, read_extras
from llmman.store import mediatypes as mt

SEED = [{"role": "user", "content": "Ahoy?"}, {"role": "assistant", "content": "Arr!"}]
PIRATE = ModelDefaults(system="You are a pirate.", parameters={"temperature": 0.2, "num_predict": 8,
                                                                "stop": ["<|im_end|>"], "num_ctx": 1024},
                       messages=SEED)
USER = {"role": "user", "content": "hi"}
SYS = {"role": "system", "content": "Be terse."}
STOP = ["<|im_end|>"]


@pytest.mark.parametrize(("parameters", "options", "expected"), [
    ({}, None, None),
    ({"temperature": 0.2}, None, {"temperature": 0.2}),
    ({"temperature": 0.2}, {}, {"temperature": 0.2}),
    ({"temperature": 0.2, "top_k": 5}, {"temperature": 0.9}, {"temperature": 0.9, "top_k": 5}),
    ({"temperature": 0.2}, {"temperature": None}, {"temperature": 0.2}),  # null counts as absent
    ({"stop": ["a"]}, {"stop": ["b"]}, {"stop": ["b"]}),
    ({"temperature": 0.2}, "bad", "bad"),  # left for the validator's 400
])
def test_merge_options_request_wins(parameters: dict[str, Any], options: object, expected: object) -> None:
    assert merge_options(parameters, options) == expected


@pytest.mark.parametrize(("messages", "expected"), [
    ([USER], [{"role": "system", "content": "You are a pirate."}, *SEED, USER]),
    ([SYS, USER], [*SEED, SYS, USER]),  # the request's own system message wins; seeds still prepended
    ([{"role": "SYSTEM", "content": "x"}], [*SEED, {"role": "SYSTEM", "content": "x"}]),
    ([], []),  # a load request stays a load request
])
def test_apply_chat_messages(messages: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    out = apply_chat({"model": "pirate", "messages": messages}, PIRATE)
    assert out["messages"] == expected
    assert out["options"] == PIRATE.parameters


def test_apply_chat_then_upstream_request_carries_defaults_and_stop() -> None:
    body = {"model": "pirate", "messages": [USER], "options": {"temperature": 0.7}}
    up = chat_request(apply_chat(body, PIRATE))
    assert up.body["temperature"] == 0.7 and up.body["max_tokens"] == 8 and up.body["stop"] == ["<|im_end|>"]
    assert up.runner.num_ctx == 1024
    messages = up.body["messages"]
    assert isinstance(messages, list) and messages[0] == {"role": "system", "content": "You are a pirate."}
    assert body == {"model": "pirate", "messages": [USER], "options": {"temperature": 0.7}}  # not mutated
    load = chat_request(apply_chat({"model": "pirate", "messages": []}, PIRATE))
    assert load.is_load and load.runner.num_ctx == 1024


@pytest.mark.parametrize(("body", "system"), [
    ({"prompt": "hi"}, "You are a pirate."),
    ({"prompt": "hi", "system": "Be terse."}, "Be terse."),
    ({"prompt": "hi", "raw": True}, None),
])
def test_apply_generate_system(body: dict[str, Any], system: str | None) -> None:
    out = apply_generate({"model": "pirate", **body}, PIRATE)
    assert out.get("system") == system
    assert out["options"] == PIRATE.parameters


def test_generate_messages_go_between_system_and_prompt() -> None:
    up = generate_request(apply_generate({"model": "pirate", "prompt": "hi"}, PIRATE))
    messages = generate_messages(up.body["messages"], PIRATE)  # type: ignore[arg-type]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]  # type: ignore[index]
    assert generate_messages([USER], PIRATE) == [*SEED, USER]
    assert up.body["max_tokens"] == 8


@pytest.mark.parametrize(("body", "fields"), [
    ({}, {"temperature": 0.2, "max_tokens": 8, "stop": ["<|im_end|>"]}),
    ({"temperature": 1.0, "max_tokens": 50}, {"temperature": 1.0, "max_tokens": 50, "stop": ["<|im_end|>"]}),
    ({"max_completion_tokens": 20}, {"temperature": 0.2, "stop": STOP, "max_completion_tokens": 20}),
    ({"temperature": None}, {"temperature": 0.2, "max_tokens": 8, "stop": ["<|im_end|>"]}),
])
def test_apply_openai_chat_fills_only_absent_fields(body: dict[str, Any], fields: dict[str, Any]) -> None:
    out = apply_openai_chat({"model": "pirate", "messages": [USER], **body}, PIRATE)
    assert {k: v for k, v in out.items() if k not in ("model", "messages")} == fields
    assert "num_ctx" not in out  # a runner option, not a request field


@pytest.mark.parametrize(("messages", "roles"), [
    ([USER], ["system", "user", "assistant", "user"]),
    ([{"role": "developer", "content": "x"}, USER], ["user", "assistant", "developer", "user"]),
])
def test_apply_openai_chat_messages(messages: list[dict[str, Any]], roles: list[str]) -> None:
    out = apply_openai_chat({"model": "pirate", "messages": messages}, PIRATE)
    assert [m["role"] for m in out["messages"]] == roles  # type: ignore[attr-defined]


def test_empty_defaults() -> None:
    assert ModelDefaults().empty and not PIRATE.empty and not ModelDefaults(system="x").empty


@pytest.mark.parametrize(("params", "text"), [
    ({}, 'num_ctx                        4096\nstop                           "<|im_end|>"'),
    ({"temperature": 0.2}, 'num_ctx                        4096\ntemperature                    0.2\n'
                           'stop                           "<|im_end|>"'),
    ({"stop": ["a", "b"], "num_ctx": 2048, "num_predict": 8.0, "mirostat": 0},
     'num_ctx                        2048\nmirostat                       0\n'
     'num_predict                    8\n'
     'stop                           "a"\nstop                           "b"'),
])
def test_parameters_text_ollama_form(params: dict[str, Any], text: str) -> None:
    assert parameters_text(4096, ["<|im_end|>"], params) == text


def test_options_text_and_modelfile_extras() -> None:
    assert options_text({"temperature": 0, "stop": "x"}) == 'temperature                    0\nstop' \
                                                            '                           "x"'
    assert options_text({}) == ""
    assert modelfile_extras("Be a pirate.", SEED, ["MIT"]) == (
        'SYSTEM """Be a pirate."""\nMESSAGE user """Ahoy?"""\nMESSAGE assistant """Arr!"""\n'
        'LICENSE """MIT"""\n')
    assert modelfile_extras("", [], []) == ""


def _layer_types(manifest: dict[str, Any]) -> list[str]:
    return [layer["mediaType"] for layer in manifest["layers"]]


def test_derive_reuses_the_gguf_layer_and_inherits(tmp_path: Path) -> None:
    store = make_store(tmp_path, ("tiny",))
    base = store.get(parse_reference("tiny"))
    pirate = derive_model(store, parse_reference("tiny"), parse_reference("pirate"), system="Arr.",
                          parameters={"temperature": 0.2, "top_k": 5}, messages=SEED, license=["MIT"])
    assert pirate.manifest["layers"][0] == base.manifest["layers"][0]  # same GGUF digest, no copy
    assert pirate.manifest["config"] == base.manifest["config"]
    assert _layer_types(pirate.manifest)[1:] == [mt.OLLAMA_PARAMS, mt.OLLAMA_SYSTEM, mt.OLLAMA_MESSAGES,
                                                 mt.OLLAMA_LICENSE]
    extras = read_extras(store.layout, pirate)
    assert (extras.system, extras.parameters, extras.messages, extras.license) == (
        "Arr.", {"temperature": 0.2, "top_k": 5}, SEED, ["MIT"])
    assert read_extras(store.layout, base).empty

    # A model derived from the derived one inherits; new fields override (parameters key by key).
    captain = derive_model(store, parse_reference("pirate"), parse_reference("captain"), system="Aye.",
                           parameters={"temperature": 0.9})
    extras = read_extras(store.layout, captain)
    assert extras.system == "Aye." and extras.parameters == {"temperature": 0.9, "top_k": 5}
    assert extras.messages == SEED and extras.license == ["MIT"]
    assert _layer_types(captain.manifest).count(mt.OLLAMA_SYSTEM) == 1

    # Removing the derived models keeps the base and its blob; removing the base keeps the derived one's.
    gguf = base.manifest["layers"][0]["digest"]
    store.remove(parse_reference("pirate"))
    store.remove(parse_reference("captain"))
    assert store.find(parse_reference("tiny")) is not None and store.blob_path(gguf).is_file()
    derive_model(store, parse_reference("tiny"), parse_reference("pirate"), system="Arr.")
    store.remove(parse_reference("tiny"))
    assert store.blob_path(gguf).is_file()
    assert read_extras(store.layout, store.get(parse_reference("pirate"))).system == "Arr."
    with pytest.raises(ModelNotFound):
        derive_model(store, parse_reference("nope"), parse_reference("x"), system="x")


def test_params_layer_is_a_json_object(tmp_path: Path) -> None:
    store = make_store(tmp_path, ("tiny",))
    model = derive_model(store, parse_reference("tiny"), parse_reference("p"), parameters={"stop": STOP})
    layer = next(d for d in model.manifest["layers"] if d["mediaType"] == mt.OLLAMA_PARAMS)
    assert json.loads(store.blob_path(layer["digest"]).read_bytes()) == {"stop": ["<|im_end|>"]}


# -- the routes, in process, with the fake llama-server (it counts prompt words and honours max_tokens) --

@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.fakes.inprocess import InProcessApp

    with InProcessApp(tmp_path_factory.mktemp("derived")) as running:
        r = running.post("/api/create", json={
            "model": "pirate", "from": "tiny", "stream": False, "system": "You are a pirate.",
            "parameters": {"num_predict": 2, "stop": ["<|im_end|>"]}, "messages": SEED, "license": "MIT"})
        assert r.status_code == 200, r.text
        yield running


def _prompt_words(*texts: str) -> int:
    from tests.fakes.fake_llama_server import count_prompt

    return count_prompt({"messages": [{"content": t} for t in texts]})


def test_create_stores_layers_and_show_reports_them(app: Any) -> None:
    base = app.store.get(parse_reference("tiny"))
    pirate = app.store.get(parse_reference("pirate"))
    assert pirate.manifest["layers"][0]["digest"] == base.manifest["layers"][0]["digest"]
    shown = app.post("/api/show", json={"model": "pirate"}).json()
    assert shown["system"] == "You are a pirate." and shown["license"] == "MIT" and shown["messages"] == SEED
    params = shown["parameters"]
    assert 'num_predict                    2\nstop                           "<|im_end|>"' in params
    assert 'SYSTEM """You are a pirate."""\n' in shown["modelfile"]
    assert "PARAMETER num_predict                    2\n" in shown["modelfile"]
    plain = app.post("/api/show", json={"model": "tiny"}).json()
    assert "system" not in plain and "messages" not in plain and plain["license"] == ""

    from llmman.cli.tables import format_show

    text = format_show(shown)
    assert "  System\n    You are a pirate." in text and "  License\n    MIT" in text


def test_ollama_chat_and_generate_get_the_defaults(app: Any) -> None:
    base = app.post("/api/chat", json={"model": "tiny", "stream": False,
                                       "messages": [{"role": "user", "content": "hi there"}]}).json()
    chat = app.post("/api/chat", json={"model": "pirate", "stream": False,
                                       "messages": [{"role": "user", "content": "hi there"}]}).json()
    assert chat["eval_count"] == 2 and chat["done_reason"] == "length"
    assert chat["prompt_eval_count"] == _prompt_words("You are a pirate.", "Ahoy?", "Arr!", "hi there")
    assert base["prompt_eval_count"] == _prompt_words("hi there") and base["eval_count"] > 2
    wins = app.post("/api/chat", json={"model": "pirate", "stream": False, "options": {"num_predict": 3},
                                       "messages": [{"role": "system", "content": "Be terse."},
                                                    {"role": "user", "content": "hi there"}]}).json()
    assert wins["eval_count"] == 3  # the request's options win
    assert wins["prompt_eval_count"] == _prompt_words("Ahoy?", "Arr!", "Be terse.", "hi there")
    gen = app.post("/api/generate", json={"model": "pirate", "stream": False, "prompt": "hi there"}).json()
    assert gen["eval_count"] == 2
    assert gen["prompt_eval_count"] == _prompt_words("You are a pirate.", "Ahoy?", "Arr!", "hi there")
    raw = app.post("/api/generate", json={"model": "pirate", "stream": False, "prompt": "hi", "raw": True})
    assert raw.json()["eval_count"] == 2, raw.text


def test_openai_chat_gets_the_defaults_unless_set(app: Any) -> None:
    msgs = [{"role": "user", "content": "hi there"}]
    out = app.post("/v1/chat/completions", json={"model": "pirate", "messages": msgs}).json()
    assert out["usage"]["completion_tokens"] == 2 and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["prompt_tokens"] == _prompt_words("You are a pirate.", "Ahoy?", "Arr!", "hi there")
    out = app.post("/v1/chat/completions", json={"model": "pirate", "messages": msgs, "max_tokens": 3}).json()
    assert out["usage"]["completion_tokens"] == 3
    plain = app.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs}).json()
    assert plain["usage"]["prompt_tokens"] == _prompt_words("hi there")


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"template": "{{ .Prompt }}"}, 501, "Go templates are not supported"),
    ({"quantize": "q4_K_M"}, 501, "does not quantize"),
    ({"from": "nope:1", "system": "x"}, 404, "nope"),
])
def test_create_refusals(app: Any, body: dict[str, Any], status: int, words: str) -> None:
    r = app.post("/api/create", json={"model": "refused", "from": "tiny", "stream": False, **body})
    assert r.status_code == status and words in r.json()["error"], r.text
    assert app.store.find(parse_reference("refused")) is None


def test_create_from_a_derived_model_inherits_and_delete_keeps_the_base(app: Any) -> None:
    r = app.post("/api/create", json={"model": "captain", "from": "pirate", "stream": False,
                                      "parameters": {"temperature": 0.5}})
    assert r.status_code == 200, r.text
    shown = app.post("/api/show", json={"model": "captain"}).json()
    assert shown["system"] == "You are a pirate."
    assert "temperature                    0.5" in shown["parameters"]
    assert "num_predict                    2" in shown["parameters"]
    gguf = app.store.get(parse_reference("tiny")).manifest["layers"][0]["digest"]
    assert app.request("DELETE", "/api/delete", json={"model": "captain"}).status_code == 200
    assert app.store.find(parse_reference("tiny")) is not None and app.store.blob_path(gguf).is_file()


def test_create_from_uploaded_files_with_a_system_prompt(app: Any) -> None:
    import hashlib

    data = (app.root / "gguf" / "tiny.gguf").read_bytes()
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    assert app.post(f"/api/blobs/{digest}", content=data).status_code in (200, 201)
    r = app.post("/api/create", json={"model": "uploaded", "files": {"tiny.gguf": digest}, "stream": False,
                                      "system": "Be brief.", "license": ["MIT", "Apache-2.0"]})
    assert r.status_code == 200, r.text
    model = app.store.get(parse_reference("uploaded"))
    assert model.manifest["layers"][0]["digest"] == digest
    shown = app.post("/api/show", json={"model": "uploaded"}).json()
    assert shown["system"] == "Be brief." and shown["license"] == "MIT\nApache-2.0"
