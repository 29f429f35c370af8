"""Derived models with real parts: the official ``ollama`` client creates a model from SmolLM2-135M with a
system prompt and parameters; show reports them; chat, generate and the OpenAI route apply them on a real
llama-server; ``llmman rm`` of the derived model keeps the base and its (shared) GGUF blob."""

from __future__ import annotations

import json
import subprocess
import sys

import ollama
import openai
import pytest

from tests.closing import closed_after_test
from tests.integration.conftest import MODEL_NAME, MODEL_REF
from tests.integration.daemons import Daemon

pytestmark = [pytest.mark.integration, pytest.mark.model]

SYSTEM = "You are a pirate. You answer every question like a pirate would, with many pirate words."
QUESTION = "Which colour is the sky on a clear day?"


def _manifest_layers(daemon: Daemon, name: str) -> list[dict[str, object]]:
    out = subprocess.run([sys.executable, "-m", "llmman", "inspect", name], env=daemon.env,
                         capture_output=True, text=True, timeout=60, check=True)
    layers = json.loads(out.stdout)["layers"]
    assert isinstance(layers, list)
    return layers


def test_create_show_chat_and_rm_a_derived_model(daemon: Daemon) -> None:
    client = closed_after_test(ollama.Client(host=daemon.url))
    done = client.create(model="pirate", from_=MODEL_NAME, system=SYSTEM,
                         parameters={"temperature": 0, "num_predict": 8})
    assert done.status == "success"

    shown = client.show("pirate")
    assert shown.parameters is not None
    assert "temperature                    0" in shown.parameters
    assert "num_predict                    8" in shown.parameters
    assert f'SYSTEM """{SYSTEM}"""' in (shown.modelfile or "")
    with daemon.client() as http:  # the SDK's ShowResponse has no ``system`` field: read the raw answer
        raw = http.post("/api/show", json={"model": "pirate"}).json()
    assert raw["system"] == SYSTEM
    cli = subprocess.run([sys.executable, "-m", "llmman", "show", "pirate"], env=daemon.env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "  System\n    You are a pirate." in cli and "temperature" in cli

    # The system prompt is applied: the prompt has as many tokens as the base model given that same
    # system message explicitly; num_predict caps the answer.
    user = {"role": "user", "content": QUESTION}
    base = client.chat(model=MODEL_NAME, messages=[{"role": "system", "content": SYSTEM}, user],
                       options={"temperature": 0, "num_predict": 8})
    bare = client.chat(model=MODEL_NAME, messages=[user], options={"temperature": 0, "num_predict": 8})
    pirate = client.chat(model="pirate", messages=[user])
    assert pirate.prompt_eval_count == base.prompt_eval_count != bare.prompt_eval_count
    assert pirate.eval_count is not None and 0 < pirate.eval_count <= 8
    longer = client.chat(model="pirate", messages=[user], options={"num_predict": 12})
    assert longer.eval_count is not None and longer.eval_count > 8  # the request's options win

    gen = client.generate(model="pirate", prompt=QUESTION)
    assert gen.eval_count is not None and 0 < gen.eval_count <= 8
    assert gen.prompt_eval_count == base.prompt_eval_count

    oai = closed_after_test(openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused"))
    answer = oai.chat.completions.create(model="pirate", messages=[user])  # type: ignore[list-item]
    assert answer.usage is not None and 0 < answer.usage.completion_tokens <= 8
    assert answer.usage.prompt_tokens == base.prompt_eval_count

    # The GGUF blob is shared, not copied; removing the derived model keeps the base and the blob.
    base_gguf = [d["digest"] for d in _manifest_layers(daemon, MODEL_NAME)]
    pirate_layers = _manifest_layers(daemon, "pirate")
    assert base_gguf[0] == pirate_layers[0]["digest"]
    blob = daemon.store / "blobs" / "sha256" / str(base_gguf[0]).split(":", 1)[1]
    subprocess.run([sys.executable, "-m", "llmman", "rm", "pirate"], env=daemon.env, capture_output=True,
                   text=True, timeout=60, check=True)
    names = [m.model for m in client.list().models]
    assert MODEL_REF in names and not any(n and "pirate" in n for n in names)
    assert blob.is_file()
