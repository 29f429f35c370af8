"""API keys middleware: the three spellings, 401 with WWW-Authenticate, open liveness paths."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from llmman.api.auth import ApiKeys
from llmman.config.table import split_list


async def ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize(("headers", "status"), [
    ({}, 401),
    ({"Authorization": "Bearer k2"}, 200),
    ({"authorization": "bearer k1"}, 200),
    ({"x-api-key": "k1"}, 200),
    ({"x-goog-api-key": "k2"}, 200),
    ({"Authorization": "Bearer nope"}, 401),
    ({"Authorization": "Basic azE="}, 401),
])
async def test_keys(headers: dict[str, str], status: int) -> None:
    transport = httpx.ASGITransport(app=ApiKeys(ok, keys=split_list("k1, k2")))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        r = await client.post("/api/chat", headers=headers)
        assert r.status_code == status
        if status == 401:
            assert r.headers["www-authenticate"] == 'Bearer realm="llmman"'
            assert "x-goog-api-key" in r.json()["error"]
        assert (await client.get("/api/version")).status_code == 200


async def test_no_keys_no_check() -> None:
    transport = httpx.ASGITransport(app=ApiKeys(ok, keys=split_list(" , ")))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.post("/api/chat")).status_code == 200


@pytest.mark.parametrize(("path", "shape"), [
    ("/api/chat", lambda d: d["error"]),
    ("/v1/chat/completions", lambda d: d["error"]["code"] == "invalid_api_key"
     and d["error"]["type"] == "invalid_request_error" and d["error"]["message"]),
    ("/v1/messages", lambda d: d["type"] == "error" and d["error"]["type"] == "authentication_error"
     and d["error"]["message"]),
    ("/v1/messages/count_tokens", lambda d: d["error"]["type"] == "authentication_error"),
    ("/v2/ai/smollm2/manifests/135m", lambda d: d["errors"][0]["code"] == "UNAUTHORIZED"
     and d["errors"][0]["message"]),
])
async def test_401_in_the_route_dialect(path: str, shape: Callable[[Any], object]) -> None:
    transport = httpx.ASGITransport(app=ApiKeys(ok, keys=split_list("k1")))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        r = await client.post(path, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == 'Bearer realm="llmman"'
    assert shape(r.json())
    assert all(spelling in r.text for spelling in ("Authorization: Bearer", "x-api-key", "x-goog-api-key"))
