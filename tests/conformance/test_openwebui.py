"""Open WebUI's calls against an Ollama backend, replayed as it sends them (Open WebUI's
``routers/ollama.py``): the model-list refresh (``/api/tags`` then ``/api/ps`` joined on ``name``),
``/api/version`` parsed as integers, ``/api/show`` on demand, a streamed ``/api/chat`` read line by
line with its usage panel fields, and the unload ``/api/generate`` with ``keep_alive: 0``. Runs
against ``base_url`` (the daemon, or a forwarding hop)."""

from __future__ import annotations

from datetime import datetime

import httpx
import orjson
import pytest

from tests.integration.conftest import MODEL_NAME, MODEL_REF

pytestmark = [pytest.mark.integration, pytest.mark.model]

HEADERS = {"Content-Type": "application/json", "X-OpenWebUI-User-Name": "Ada",
           "X-OpenWebUI-User-Id": "u1", "X-OpenWebUI-User-Email": "ada@example.com",
           "X-OpenWebUI-User-Role": "admin"}  # fmt: skip
USAGE_FIELDS = ("eval_count", "eval_duration", "prompt_eval_count", "prompt_eval_duration", "total_duration",
                "load_duration")  # fmt: skip
AIOHTTP_LINE_LIMIT = 2**16  # aiohttp's default: longer lines fail with "Chunk too big"


def _version_tuple(text: str) -> tuple[int, ...]:
    """Open WebUI's parse: drop a leading ``v`` and everything after ``-``, int() each part."""
    return tuple(int(p) for p in text.lstrip("v").split("-")[0].split("."))


def test_startup_chat_and_unload(base_url: str) -> None:
    with httpx.Client(base_url=base_url, headers=HEADERS, timeout=120) as client:
        assert len(_version_tuple(client.get("/api/version").json()["version"])) == 3

        # Model-list refresh: tags, then ps joined on "name"; the picker's id is model["model"].
        tags = {m["model"]: m for m in client.get("/api/tags").json()["models"]}
        assert MODEL_REF in tags and tags[MODEL_REF]["name"] == MODEL_REF
        client.get("/api/ps").raise_for_status()

        # A name without a colon gets ":latest"; ours has a tag, so it is sent as listed.
        show = client.post("/api/show", json={"model": MODEL_REF}).json()
        assert "completion" in show["capabilities"] and isinstance(show["model_info"], dict)
        assert show["details"]["family"] and "num_ctx" in show["parameters"]

        body = {"model": MODEL_REF, "stream": True, "keep_alive": "5m",
                "messages": [{"role": "system", "content": "You answer in one word."},
                             {"role": "user", "content": "What is the capital of France?"}],
                "options": {"temperature": 0, "num_predict": 16}}  # fmt: skip
        lines = []
        with client.stream("POST", "/api/chat", json={**body, "think": False}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
            for line in r.iter_lines():
                assert line and len(line) < AIOHTTP_LINE_LIMIT
                lines.append(orjson.loads(line))
        assert all("message" in o and "error" not in o for o in lines)
        assert [o["done"] for o in lines] == [False] * (len(lines) - 1) + [True]
        assert "Paris" in "".join(o["message"]["content"] for o in lines)
        final = lines[-1]
        assert all(isinstance(final[k], int) and final[k] >= 0 for k in USAGE_FIELDS)
        assert final["eval_count"] > 0 and final["eval_duration"] > 0

        ps = {m["name"]: m for m in client.get("/api/ps").json()["models"]}
        assert ps[MODEL_REF]["model"] == MODEL_REF and ps[MODEL_REF]["size_vram"] <= ps[MODEL_REF]["size"]
        expires = datetime.fromisoformat(ps[MODEL_REF]["expires_at"]).timestamp()  # as Open WebUI parses it
        assert expires > datetime.now().timestamp()

        # Unload: sent to every URL that has the model.
        unload = client.post("/api/generate", json={"model": MODEL_REF, "keep_alive": 0, "prompt": ""})
        assert unload.status_code == 200 and unload.json()["done_reason"] == "unload"
        assert MODEL_REF not in {m["name"] for m in client.get("/api/ps").json()["models"]}


def test_errors_carry_an_error_field(base_url: str) -> None:
    with httpx.Client(base_url=base_url, headers=HEADERS, timeout=60) as client:
        ask = [{"role": "user", "content": "x"}]
        r = client.post("/api/chat", json={"model": "nope:latest", "messages": ask})
        assert r.status_code == 404 and r.json()["error"].startswith("model 'nope:latest' not found")
        r = client.post("/api/chat", json={"model": MODEL_NAME, "think": True,
                                           "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
        assert (r.status_code, r.json()["error"]) == (400, f'"{MODEL_NAME}" does not support thinking')
