"""Issue 14 items 2, 5 and 7 through real daemons with the real SmolLM2 model, each test twice: ``[local]``
straight to ``node`` (the daemon storing the models) and ``[hop]`` through ``front`` (127.0.0.2, an empty
store, ``node`` its only peer), which must forward and never serve.

* Prompts longer than the context (512 tokens a slot here): ``/api/chat`` drops the oldest messages and
  ``/api/generate`` keeps the end of its prompt, as Ollama does by default; ``truncate: false`` is Ollama's
  400; the OpenAI route keeps llama-server's own 400.
* Versions: ``/api/version`` is the Ollama API level; ``x-llmman-version`` is llmman's own, on every answer.
* Fill-in-the-middle: ``/api/generate`` with ``suffix`` on ``smollm2-fim:135m`` (tests/integration/
  derived_ggufs.py) runs on llama-server's ``/infill``, streamed and not; a model without FIM tokens gets
  Ollama's error.
* llama-server's own routes with ``model`` in the body: ``/tokenize``, ``/detokenize``,
  ``/apply-template``, ``/infill``, reranking (refused for a model that is not a reranker).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from llmman import __version__
from llmman.refs import parse_reference
from llmman.store import Store
from tests.integration.daemons import Daemon, start_daemon
from tests.integration.derived_ggufs import FIM_NAME, RERANK_NAME, write_fim_model, write_rerank_model

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(300)]

SMOL = "smollm2:135m"
N_CTX = 512
TARGET = N_CTX - (N_CTX - 4) // 2  # Ollama's cut: num_keep 4, half of the rest left to the answer
REFUSAL = "the input length exceeds the context length"
SYSTEM = "You are a terse assistant. Answer in one short sentence. " * 3
FILLER = " ".join(f"item{i} is a fine word" for i in range(40))  # ~200 tokens
SHORT = " ".join(f"item{i} is fine" for i in range(12))  # ~50 tokens
CUT = {"num_predict": 8, "temperature": 0}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> Iterator[Daemon]:
    """A daemon storing smollm2:135m and its FIM and reranking copies, 512 tokens a slot."""
    tmp = tmp_path_factory.mktemp("node")
    store = Store(tmp / "store")
    store.build(parse_reference(SMOL), model_file)
    work = tmp_path_factory.mktemp("derived")
    for name, write in ((FIM_NAME, write_fim_model), (RERANK_NAME, write_rerank_model)):
        path = write(model_file, work / "model.gguf")
        store.build(parse_reference(name), path)
        path.unlink()
    d = start_daemon(tmp, extra_env={"LLMMAN_CONTEXT_LENGTH": str(N_CTX), "LLMMAN_NUM_PARALLEL": "1"})
    yield d
    if d.process.poll() is None:
        d.stop(signal.SIGTERM)


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, node: Daemon) -> Iterator[Daemon]:
    """An empty daemon on 127.0.0.2 whose one peer is ``node``."""
    d = start_daemon(tmp_path_factory.mktemp("front"), host="127.0.0.2", extra_env={"LLMMAN_PEERS": node.url})
    yield d
    if d.process.poll() is None:
        d.stop(signal.SIGTERM)


@pytest.fixture(params=["local", "hop"])
def url(request: pytest.FixtureRequest, node: Daemon) -> Iterator[str]:
    """Where the client talks: ``node`` itself, or ``front``, which must forward (no child of its own)."""
    if request.param == "local":
        yield node.url
        return
    hop: Daemon = request.getfixturevalue("front")
    yield hop.url
    assert hop.children() == [], "the front served a model itself instead of forwarding"


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=240)


def lines(response: httpx.Response) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in response.text.splitlines()]


def history(turns: int, filler: str = FILLER) -> list[dict[str, str]]:
    """A system message, ``turns`` old question/answer pairs of ``filler`` each, then a short question."""
    messages = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        messages += [{"role": "user", "content": f"Question {i}: {filler}"},
                     {"role": "assistant", "content": f"Answer {i}: {filler}"}]
    return [*messages, {"role": "user", "content": "Say hi."}]


# --- prompts longer than the context ---

@pytest.mark.parametrize("stream", [False, True])
def test_long_chat_drops_the_oldest_messages(url: str, stream: bool) -> None:
    r = post(url, "/api/chat", {"model": SMOL, "messages": history(6, SHORT), "stream": stream,
                                "options": CUT})
    assert r.status_code == 200, r.text
    final = lines(r)[-1] if stream else r.json()
    assert final["done"] is True and "error" not in final, final
    # Cut to Ollama's target, keeping more than the system message and the question (~60 tokens): the
    # latest whole turns (~110 tokens each) that fit.
    assert 160 < final["prompt_eval_count"] <= TARGET, final


@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
def test_one_message_longer_than_the_context_keeps_its_end(url: str, route: str) -> None:
    text = f"{FILLER} {FILLER} {FILLER} Now say hi."
    body: dict[str, Any] = {"model": SMOL, "stream": False, "options": CUT}
    body |= {"messages": [{"role": "user", "content": text}]} if route == "/api/chat" else {"prompt": text}
    r = post(url, route, body)
    assert r.status_code == 200, r.text
    assert TARGET - 16 <= r.json()["prompt_eval_count"] <= TARGET, r.json()


def test_long_raw_prompt_keeps_its_end(url: str) -> None:
    r = post(url, "/api/generate", {"model": SMOL, "raw": True, "prompt": f"{FILLER} {FILLER} {FILLER}",
                                    "stream": False, "options": CUT})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] == TARGET, r.json()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
def test_truncate_false_is_refused(url: str, route: str, stream: bool) -> None:
    body: dict[str, Any] = {"model": SMOL, "stream": stream, "truncate": False, "options": CUT}
    body |= {"messages": history(4)} if route == "/api/chat" else {"prompt": f"{FILLER} {FILLER} {FILLER}"}
    r = post(url, route, body)
    assert r.status_code == 400, r.text
    assert r.json() == {"error": REFUSAL}


def test_truncate_must_be_a_boolean(url: str) -> None:
    r = post(url, "/api/chat", {"model": SMOL, "messages": history(0), "truncate": "no"})
    assert r.status_code == 400 and r.json() == {"error": "truncate must be a boolean"}, r.text


def test_short_chat_is_sent_as_it_is(url: str) -> None:
    r = post(url, "/api/chat", {"model": SMOL, "messages": history(3, SHORT), "stream": False,
                                "truncate": False, "options": CUT})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] > TARGET  # over the cut's target, under the context: not cut


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_other_dialects_keep_llama_servers_refusal(url: str, route: str) -> None:
    messages = history(4)
    body: dict[str, Any] = {"model": SMOL, "max_tokens": 8, "messages": messages}
    if route == "/v1/messages":
        body = {"model": SMOL, "max_tokens": 8, "system": SYSTEM, "messages": messages[1:]}
    elif route == "/v1/responses":
        body = {"model": SMOL, "max_output_tokens": 16, "input": [{"type": "message", **m} for m in messages]}
    r = post(url, route, body)
    assert r.status_code == 400, r.text
    assert "exceeds the available context size" in r.json()["error"]["message"], r.text


# --- versions ---

def test_versions(url: str) -> None:
    r = httpx.get(url + "/api/version", timeout=10)
    version = r.json()["version"]
    assert tuple(int(p) for p in version.split(".")) >= (0, 6, 4), version
    assert r.headers["x-llmman-version"] == __version__
    for answer in (httpx.get(url + "/api/tags", timeout=10),
                   post(url, "/api/show", {"model": "nope:1b"}),
                   post(url, "/api/generate", {"model": SMOL, "prompt": "hi", "stream": False,
                                               "options": CUT})):
        assert answer.headers.get("x-llmman-version") == __version__, (answer.request.url, answer.headers)


# --- fill-in-the-middle ---

def test_fim_model_shows_insert(url: str) -> None:
    assert "insert" in post(url, "/api/show", {"model": FIM_NAME}).json()["capabilities"]
    assert "insert" not in post(url, "/api/show", {"model": SMOL}).json()["capabilities"]


FIM = {"prompt": "def add(a, b):\n    return ", "suffix": "\n\nprint(add(1, 2))\n", "options": CUT}


def test_fim_generate(url: str) -> None:
    r = post(url, "/api/generate", {"model": FIM_NAME, "stream": False, **FIM})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == FIM_NAME and body["done"] is True, body
    assert isinstance(body["response"], str) and body["done_reason"] in {"stop", "length"}, body
    assert body["eval_count"] >= 1 and body["prompt_eval_count"] >= 10, body


def test_fim_generate_streamed(url: str) -> None:
    r = post(url, "/api/generate", {"model": FIM_NAME, "stream": True, **FIM})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson"), r.text
    objects = lines(r)
    assert [o["done"] for o in objects].count(True) == 1 and objects[-1]["done"] is True, objects
    assert all(o["model"] == FIM_NAME and "response" in o for o in objects), objects
    assert len(objects) >= 2 and objects[-1]["eval_count"] >= 1, objects


def test_fim_on_a_model_without_fim_tokens(url: str) -> None:
    r = post(url, "/api/generate", {"model": SMOL, "stream": False, **FIM})
    assert r.status_code == 400 and r.json() == {"error": f"{SMOL} does not support insert"}, r.text


# --- llama-server's own routes ---

def test_tokenize_detokenize_apply_template(url: str) -> None:
    tokens = post(url, "/tokenize", {"model": SMOL, "content": "Hello world"})
    assert tokens.status_code == 200, tokens.text
    ids = tokens.json()["tokens"]
    assert ids and all(isinstance(t, int) for t in ids), tokens.json()
    text = post(url, "/detokenize", {"model": SMOL, "tokens": ids})
    assert text.status_code == 200 and text.json()["content"].strip() == "Hello world", text.text
    rendered = post(url, "/apply-template", {"model": SMOL, "messages": [{"role": "user", "content": "hi"}]})
    assert rendered.status_code == 200, rendered.text
    assert "<|im_start|>user\nhi<|im_end|>" in rendered.json()["prompt"], rendered.json()


def test_infill_route(url: str) -> None:
    body = {"model": FIM_NAME, "input_prefix": FIM["prompt"], "input_suffix": FIM["suffix"], "n_predict": 4}
    r = post(url, "/infill", body)
    assert r.status_code == 200 and isinstance(r.json()["content"], str), r.text
    streamed = post(url, "/infill", {**body, "stream": True})
    assert streamed.status_code == 200, streamed.text
    events = [orjson.loads(line[5:]) for line in streamed.text.splitlines() if line.startswith("data:")]
    assert events and events[-1]["stop"] is True, streamed.text
    refused = post(url, "/infill", {**body, "model": SMOL})
    assert refused.status_code == 400 and refused.json() == {"error": f"{SMOL} does not support insert"}


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank"])
def test_rerank_refused_for_a_model_that_is_not_a_reranker(url: str, path: str) -> None:
    r = post(url, path, {"model": SMOL, "query": "a cat", "documents": ["a cat is an animal", "Paris"]})
    assert r.status_code == 400, r.text
    assert "does not support reranking" in r.text


def test_rerank_on_a_reranker(url: str) -> None:
    r = post(url, "/v1/rerank", {"model": RERANK_NAME, "query": "a cat",
                                 "documents": ["a cat is an animal", "Paris is a city"]})
    assert r.status_code == 200, r.text
    assert sorted(item["index"] for item in r.json()["results"]) == [0, 1], r.json()


def test_llama_routes_name_the_model(url: str) -> None:
    missing = post(url, "/tokenize", {"content": "hi"})
    assert missing.status_code == 400 and missing.json() == {"error": "model is required"}, missing.text
    unknown = post(url, "/tokenize", {"model": "nope:1b", "content": "hi"})
    assert unknown.status_code == 404, unknown.text
