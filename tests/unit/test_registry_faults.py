"""Pull/push/create/blob faults through the daemon's app in-process: unreachable Hugging Face, unloads
that must not pull, non-boolean flags, concurrent creates of one name, truncated blob uploads."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.fakes.inprocess import InProcessApp

from llmman.refs import Reference, parse_reference
from llmman.registry.client import RegistryOptions, RegistryUnavailable
from llmman.registry.huggingface import pull_huggingface
from llmman.registry.puller import Emit, Puller
from llmman.store import Store, StoredModel


class RecordingPuller(Puller):
    """A real puller that records every reference it was asked to pull."""

    def __init__(self, store: Store, options: RegistryOptions | None = None) -> None:
        super().__init__(store, options=options)
        self.asked: list[str] = []

    def _pull(self, ref: Reference, emit: Emit, insecure: bool) -> StoredModel:
        self.asked.append(str(ref))
        return super()._pull(ref, emit, insecure)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def app(tmp_path: Path) -> Iterator[InProcessApp]:
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{_free_port()}"}  # nothing listens there
    with InProcessApp(tmp_path, env=env) as running:
        assert running.settings.environment.hf_endpoint == env["HF_ENDPOINT"]
        puller = RecordingPuller(running.store, RegistryOptions.of(running.settings))
        object.__setattr__(running.services, "puller", puller)
        running.services.gateway.puller = puller
        yield running


def test_unreachable_hugging_face_is_a_registry_error_not_a_crash(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(RegistryUnavailable, match=r"cannot reach http://127\.0\.0\.1"):
        pull_huggingface(Store(tmp_path / "s"), parse_reference("hf.co/owner/repo"), lambda _line: None,
                         endpoint=endpoint)
    assert not list((tmp_path / "s").rglob("*.tmp"))


def test_unreachable_hugging_face_through_the_api(app: InProcessApp) -> None:
    r = app.post("/api/pull", json={"model": "hf.co/owner/repo"})
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert r.status_code == 200 and "cannot reach" in lines[-1]["error"], r.text
    r = app.post("/api/pull", json={"model": "hf.co/owner/repo", "stream": False})
    assert r.status_code == 503 and "cannot reach" in r.json()["error"], r.text
    r = app.post("/api/generate", json={"model": "hf.co/owner/repo", "prompt": "hi", "stream": False})
    assert r.status_code == 404, r.text
    assert r.json()["error"].startswith("model 'hf.co/owner/repo' not found: ") and "cannot reach" in r.text


@pytest.mark.parametrize("route,body", [
    ("/api/generate", {"keep_alive": 0}),
    ("/api/generate", {"keep_alive": "0s", "prompt": ""}),
    ("/api/chat", {"keep_alive": 0, "messages": []}),
])
def test_an_unload_never_pulls(app: InProcessApp, route: str, body: dict[str, Any]) -> None:
    name = f"127.0.0.1:{_free_port()}/ai/nosuch"  # a registry nobody serves: a pull fails fast, offline
    r = app.post(route, json={"model": name, **body})
    assert r.status_code == 404 and r.json()["error"] == f"model '{name}' not found", r.text
    assert app.services.gateway.puller is not None
    assert app.services.gateway.puller.asked == []  # type: ignore[attr-defined]
    r = app.post(route, json={"model": name, **body, "keep_alive": "5m"})  # a load does pull on demand
    assert r.status_code == 404 and r.json()["error"].startswith(f"model '{name}' not found: "), r.text
    assert app.services.gateway.puller.asked == [f"{name}:latest"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("route,key", [("/api/pull", "insecure"), ("/api/pull", "stream"),
                                       ("/api/push", "insecure"), ("/api/push", "stream")])
def test_pull_and_push_flags_must_be_booleans(app: InProcessApp, route: str, key: str) -> None:
    r = app.post(route, json={"model": "tiny", key: "yes"})
    assert r.status_code == 400 and r.json()["error"] == f"{key} must be a boolean", r.text
    assert app.services.gateway.puller.asked == []  # type: ignore[union-attr]


def test_concurrent_creates_of_one_name_all_succeed_last_write_wins(app: InProcessApp) -> None:
    barrier = threading.Barrier(8)
    statuses: dict[int, tuple[int, str]] = {}

    def create(i: int) -> None:
        barrier.wait()
        r = app.post("/api/create", json={"model": "race2", "from": "tiny", "system": f"prompt {i}",
                                          "stream": False})
        statuses[i] = (r.status_code, r.text)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(code == 200 for code, _ in statuses.values()) and len(statuses) == 8, statuses
    index = json.loads((app.store.root / "index.json").read_text())
    entries = [e for e in index["manifests"]
               if e["annotations"]["org.opencontainers.image.ref.name"] == "docker.io/ai/race2:latest"]
    assert len(entries) == 1 and app.store.blob_path(entries[0]["digest"]).is_file()
    r = app.post("/api/show", json={"model": "race2"})
    assert r.status_code == 200 and r.json()["system"] in {f"prompt {i}" for i in range(8)}, r.text


def test_truncated_blob_upload_leaves_no_partial_and_no_unretrieved_task(tmp_path: Path) -> None:
    from starlette.requests import ClientDisconnect, Request

    from llmman.api.pull import blob_upload

    store = Store(tmp_path / "store")
    digest = "sha256:" + "ab" * 32
    problems: list[dict[str, Any]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: problems.append(ctx))
        messages: Iterator[dict[str, Any]] = iter([
            {"type": "http.request", "body": b"x" * 1000, "more_body": True}, {"type": "http.disconnect"}])

        async def receive() -> dict[str, Any]:
            return next(messages)

        scope = {"type": "http", "method": "POST", "path": f"/api/blobs/{digest}", "headers": [],
                 "path_params": {"digest": digest},
                 "app": SimpleNamespace(state=SimpleNamespace(services=SimpleNamespace(store=store)))}
        with pytest.raises(ClientDisconnect):
            await blob_upload(Request(scope, receive))
        writers = asyncio.all_tasks() - {asyncio.current_task()}  # the writer, if still draining
        if writers:
            _, pending = await asyncio.wait(writers, timeout=30)
            assert not pending
        writers.clear()
        gc.collect()  # an unretrieved task exception is reported when the task is collected
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert problems == []
    assert not store.has_blob(digest) and not list((tmp_path / "store").rglob("*.tmp"))


def test_tls_mismatch_says_how_to_reach_a_plain_http_registry() -> None:
    import ssl

    import httpx

    from llmman.registry.client import RegistryClient, _describe

    cause = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)")
    mismatch = httpx.ConnectError(str(cause))
    mismatch.__cause__ = cause
    assert "use --insecure" in _describe(mismatch) and "LLMMAN_INSECURE_REGISTRIES" in _describe(mismatch)
    refused = httpx.ConnectError("certificate verify failed")
    refused.__cause__ = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] self-signed")
    assert "--insecure" not in _describe(refused)
    assert RegistryClient("localhost:5000").loopback and RegistryClient("127.0.0.9:5000").loopback
    assert not RegistryClient("registry.example:5000").loopback
