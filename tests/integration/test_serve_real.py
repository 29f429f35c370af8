"""The whole path with real parts: a real daemon, a real llama-server, SmolLM2-135M, and the
official ``ollama`` and ``openai`` clients."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
from datetime import datetime

import httpx
import ollama
import openai
import psutil
import pytest

from tests.closing import closed_after_test
from tests.integration.conftest import MODEL_NAME, MODEL_REF
from tests.integration.daemons import Daemon

pytestmark = [pytest.mark.integration, pytest.mark.model]

QUESTION = "What is the capital of France? Answer in one word."


def _ps(daemon: Daemon) -> list[dict[str, object]]:
    with daemon.client() as c:
        models = c.get("/api/ps").json()["models"]
    assert isinstance(models, list)
    return models


def test_ollama_client_chat_streaming_and_not(daemon: Daemon) -> None:
    client = closed_after_test(ollama.Client(host=daemon.url))
    reply = client.chat(model=MODEL_NAME, messages=[{"role": "user", "content": QUESTION}],
                        options={"temperature": 0})
    assert "Paris" in reply.message.content
    assert reply.done and reply.done_reason == "stop"
    assert reply.eval_count and reply.eval_count > 0
    assert reply.prompt_eval_count and reply.prompt_eval_count > 0
    assert reply.total_duration and reply.eval_duration and reply.total_duration >= reply.eval_duration

    parts = list(client.chat(model=MODEL_NAME, messages=[{"role": "user", "content": QUESTION}],
                             options={"temperature": 0}, stream=True))
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done
    text = "".join(p.message.content or "" for p in parts)
    assert "Paris" in text
    assert parts[-1].done_reason == "stop" and (parts[-1].eval_count or 0) > 0


def test_ollama_generate_and_length_limit(daemon: Daemon) -> None:
    client = closed_after_test(ollama.Client(host=daemon.url))
    out = client.generate(model=MODEL_NAME, prompt="Count from one to fifty in words.",
                          options={"temperature": 0, "num_predict": 5})
    assert out.done_reason == "length"
    assert out.eval_count == 5
    assert out.response


def test_openai_client_chat_streaming_and_not(daemon: Daemon) -> None:
    client = closed_after_test(openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused"))
    done = client.chat.completions.create(model=MODEL_NAME, temperature=0,
                                          messages=[{"role": "user", "content": QUESTION}])
    assert "Paris" in (done.choices[0].message.content or "")
    assert done.usage is not None and done.usage.completion_tokens > 0

    stream = client.chat.completions.create(model=MODEL_NAME, temperature=0, stream=True,
                                            messages=[{"role": "user", "content": QUESTION}])
    text = "".join((chunk.choices[0].delta.content or "") for chunk in stream if chunk.choices)
    assert "Paris" in text

    listed = [m.id for m in client.models.list().data]
    assert MODEL_REF in listed


def test_llmman_run_prints_an_answer(daemon: Daemon) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmman", "run", MODEL_NAME, QUESTION],
        env=daemon.env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    # `llmman run` samples like `ollama run` (temperature 0.8), so the words vary; it must print an answer.
    assert len(result.stdout.split()) >= 2 and result.stdout.endswith("\n")


def test_ps_shows_expiry_and_keep_alive_zero_unloads(daemon: Daemon) -> None:
    with daemon.client() as c:
        r = c.post("/api/generate", json={"model": MODEL_NAME, "keep_alive": "10m"})
        assert r.status_code == 200 and r.json()["done_reason"] == "load"
        (entry,) = [m for m in _ps(daemon) if m["name"] == MODEL_REF]
        assert entry["model"] == MODEL_REF and entry["size"] == entry["size"] and int(str(entry["size"])) > 0
        expires = datetime.fromisoformat(str(entry["expires_at"]))
        left = (expires - datetime.now(expires.tzinfo)).total_seconds()
        assert 60 < left <= 600
        assert entry["context_length"] and int(str(entry["context_length"])) > 0

        r = c.post("/api/generate", json={"model": MODEL_NAME, "keep_alive": 0})
        assert r.status_code == 200 and r.json()["done_reason"] == "unload"
        assert [m for m in _ps(daemon) if m["name"] == MODEL_REF] == []
        assert daemon.children() == []


def test_three_concurrent_first_requests_start_one_child(daemon: Daemon) -> None:
    with daemon.client() as c:
        c.post("/api/generate", json={"model": MODEL_NAME, "keep_alive": 0})
    assert daemon.children() == []
    loads_before = daemon.log_text().count(f"loading {MODEL_REF}")

    def ask(_: int) -> str:
        with daemon.client() as c:
            r = c.post("/api/chat", json={"model": MODEL_NAME, "stream": False, "options": {"num_predict": 8},
                                          "messages": [{"role": "user", "content": "Say hi."}]})
            assert r.status_code == 200, r.text
            return str(r.json()["message"]["content"])

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(ask, range(3)))
    assert all(answers)
    assert len(daemon.children()) == 1
    assert daemon.log_text().count(f"loading {MODEL_REF}") == loads_before + 1


def test_child_killed_mid_stream_gives_an_error_then_reloads(daemon: Daemon) -> None:
    client = closed_after_test(ollama.Client(host=daemon.url))
    client.generate(model=MODEL_NAME, prompt="", keep_alive="5m")
    (first,) = daemon.children()
    stream = client.generate(model=MODEL_NAME, prompt="Count from 1 to 1000, one number per line.",
                             options={"temperature": 0, "num_predict": 4000}, stream=True)
    with pytest.raises(ollama.ResponseError):
        for n, part in enumerate(stream):
            assert not part.done
            if n == 3:
                os.kill(first.pid, signal.SIGKILL)
    again = client.chat(model=MODEL_NAME, messages=[{"role": "user", "content": QUESTION}],
                        options={"temperature": 0})
    assert "Paris" in again.message.content
    (second,) = daemon.children()
    assert second.pid != first.pid


@pytest.mark.parametrize(
    ("path", "body", "status", "expect"),
    [
        ("/api/chat", b"{not json", 400, None),
        ("/api/chat", b"", 400, "missing request body"),
        ("/api/chat", b'{"model": 5, "messages": []}', 400, None),
        ("/api/chat", b'{"model": "smollm2:135m", "messages": "hi"}', 400, None),
        ("/api/generate", b'{"model": "smollm2:135m", "prompt": "x", "options": {"top_k": "x"}}', 400,
         "top_k"),
        ("/api/chat", b'{"model": "nope:1b", "messages": [{"role": "user", "content": "x"}]}', 404,
         "model 'nope:1b' not found"),
        ("/api/generate", b'{"model": "nope:1b", "prompt": "x"}', 404, "model 'nope:1b' not found"),
        ("/api/show", b'{"model": "nope:1b"}', 404, "model 'nope:1b' not found"),
    ],
)
def test_bad_requests_in_ollama_dialect(daemon: Daemon, path: str, body: bytes, status: int,
                                        expect: str | None) -> None:
    with daemon.client() as c:
        r = c.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert isinstance(err, str) and err
    if expect:
        assert expect in err
    assert "Traceback" not in r.text


@pytest.mark.parametrize(
    ("body", "status"),
    [(b"{not json", 400), (b'{"messages": []}', 400), (b'{"model": "nope:1b", "messages": []}', 400),
     (b'{"model": "nope:1b", "messages": [{"role": "user", "content": "x"}]}', 404)],
)
def test_bad_requests_in_openai_dialect(daemon: Daemon, body: bytes, status: int) -> None:
    with daemon.client() as c:
        r = c.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    client = closed_after_test(openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0))
    if status == 404:
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="nope:1b", messages=[{"role": "user", "content": "x"}])


def test_version_root_tags_show(daemon: Daemon) -> None:
    with daemon.client() as c:
        v = c.get("/api/version").json()["version"]
        assert all(part.isdigit() for part in v.split("."))
        assert c.get("/").text == "Ollama is running"
        assert c.head("/").status_code == 200
        tags = c.get("/api/tags").json()["models"]
        (entry,) = [t for t in tags if t["name"] == MODEL_REF]
        assert entry["details"]["quantization_level"] == "Q4_1"
        assert entry["details"]["family"] == "llama"
    shown = closed_after_test(ollama.Client(host=daemon.url)).show(MODEL_NAME)
    assert shown.modelinfo is not None and shown.modelinfo.get("llama.context_length") == 8192
    assert shown.template and "im_start" in shown.template
    assert shown.capabilities and "completion" in shown.capabilities


def test_sigterm_leaves_no_child(tmp_path_factory: pytest.TempPathFactory, model_file: object) -> None:
    from llmman.refs import parse_reference
    from llmman.store import Store
    from tests.integration.daemons import start_daemon

    tmp = tmp_path_factory.mktemp("sigterm")
    Store(tmp / "store").build(parse_reference(MODEL_NAME), model_file)  # type: ignore[arg-type]
    d = start_daemon(tmp)
    with d.client() as c:
        assert c.post("/api/generate", json={"model": MODEL_NAME}).status_code == 200
    children = d.children()
    assert len(children) == 1
    assert d.stop(signal.SIGTERM) == 0
    _gone, alive = psutil.wait_procs(children, timeout=15)
    assert alive == []
    with pytest.raises(httpx.TransportError):
        httpx.get(d.url + "/api/version", timeout=2)


def test_sigkill_of_the_daemon_takes_its_child_along(tmp_path_factory: pytest.TempPathFactory,
                                                     model_file: object) -> None:
    from llmman.refs import parse_reference
    from llmman.store import Store
    from tests.integration.daemons import start_daemon

    tmp = tmp_path_factory.mktemp("sigkill")
    Store(tmp / "store").build(parse_reference(MODEL_NAME), model_file)  # type: ignore[arg-type]
    d = start_daemon(tmp)
    with d.client() as c:
        assert c.post("/api/generate", json={"model": MODEL_NAME}).status_code == 200
    children = d.children()
    assert len(children) == 1
    d.stop(signal.SIGKILL)
    _gone, alive = psutil.wait_procs(children, timeout=15)
    assert alive == []
