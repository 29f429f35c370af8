"""An aggregation of two real daemons (docs/aggregation.md) with the real SmolLM2 model.

``big`` (127.0.0.3, 4 GB cap) and ``small`` (127.0.0.2, 1 GB cap, names ``big`` and a dead peer). Both
store ``smollm2:135m``; only ``small`` stores ``mine:1``, only ``big`` stores ``onlybig:1``.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from tests.integration.daemons import Daemon, free_port, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.model]

SMOL, MINE, ONLYBIG = "smollm2:135m", "mine:1", "onlybig:1"
HOP = {"x-llmman-hop": "1"}
BASE = {"LLMMAN_NUM_PARALLEL": "2", "LLMMAN_CONTEXT_LENGTH": "1024", "LLMMAN_DEBUG": "1"}


@dataclass
class Pair:
    small: Daemon
    big: Daemon

    @property
    def big_name(self) -> str:
        return self.big.url.removeprefix("http://")


def _store(tmp: Path, model_file: Path, *names: str) -> None:
    store = Store(tmp / "store")
    for name in names:
        store.build(parse_reference(name), model_file)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> Iterator[Pair]:
    tb, ts = tmp_path_factory.mktemp("big"), tmp_path_factory.mktemp("small")
    _store(tb, model_file, SMOL, ONLYBIG)
    _store(ts, model_file, SMOL, MINE)
    big = start_daemon(tb, host="127.0.0.3", extra_env=BASE | {"LLMMAN_MEMORY": "4GB"})
    dead = f"127.0.0.4:{free_port('127.0.0.4')}"
    try:
        small = start_daemon(ts, host="127.0.0.2", extra_env=BASE | {
            "LLMMAN_MEMORY": "1GB", "LLMMAN_PEERS": f"{big.url}, {dead}"})
    except BaseException:
        big.stop()
        raise
    yield Pair(small, big)
    small.stop(signal.SIGTERM)
    big.stop(signal.SIGTERM)


def _local_ps(d: Daemon) -> list[str]:
    return [str(m["name"]) for m in httpx.get(d.url + "/api/ps", headers=HOP, timeout=10).json()["models"]]


def _unload_all(p: Pair) -> None:
    for d in (p.small, p.big):
        for name in _local_ps(d):
            r = httpx.post(d.url + "/api/generate", json={"model": name, "keep_alive": 0}, headers=HOP,
                           timeout=60)
            assert r.status_code == 200, r.text


def _chat(url: str, model: str, **extra: object) -> list[dict[str, object]]:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi"}],
            "options": {"num_predict": 8}, **extra}
    with httpx.stream("POST", url + "/api/chat", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line) for line in r.iter_lines() if line]


def test_cold_request_goes_to_the_node_with_most_room(pair: Pair) -> None:
    _unload_all(pair)
    lines = _chat(pair.small.url, SMOL)
    assert lines[-1]["done"] is True and "error" not in lines[-1]
    assert _local_ps(pair.small) == []
    assert _local_ps(pair.big) == [f"docker.io/ai/{SMOL}"]
    merged = httpx.get(pair.small.url + "/api/ps", timeout=10).json()["models"]
    assert [(m["name"], m["node"]) for m in merged] == [(f"docker.io/ai/{SMOL}", pair.big_name)]
    # Loaded on big: a second request lands there again (never a second copy).
    _chat(pair.small.url, SMOL)
    assert _local_ps(pair.small) == []


def test_openai_stream_is_forwarded_byte_for_byte(pair: Pair) -> None:
    body = {"model": SMOL, "stream": True, "max_tokens": 6, "messages": [{"role": "user", "content": "Hi"}]}
    with httpx.stream("POST", pair.small.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


def test_a_model_only_this_node_stores_stays_here(pair: Pair) -> None:
    _chat(pair.small.url, MINE)
    assert f"docker.io/library/{MINE}" in _local_ps(pair.small) or any(
        MINE in n for n in _local_ps(pair.small))
    assert not any(MINE in n for n in _local_ps(pair.big))


def test_stop_unloads_wherever_the_model_is(pair: Pair) -> None:
    _chat(pair.small.url, SMOL)
    assert any(SMOL in n for n in _local_ps(pair.big))
    r = httpx.post(pair.small.url + "/api/generate", json={"model": SMOL, "keep_alive": 0}, timeout=60)
    assert r.status_code == 200, r.text
    assert not any(SMOL in n for n in _local_ps(pair.big))


def test_hopped_request_is_served_here(pair: Pair) -> None:
    _unload_all(pair)
    _chat(pair.small.url, SMOL)  # now loaded on big
    r = httpx.post(pair.small.url + "/api/chat", headers=HOP, timeout=120, json={
        "model": SMOL, "stream": False, "messages": [{"role": "user", "content": "Hi"}],
        "options": {"num_predict": 4}})
    assert r.status_code == 200, r.text
    assert any(SMOL in n for n in _local_ps(pair.small))
    _unload_all(pair)


def test_lists_and_show_cover_every_node(pair: Pair) -> None:
    tags = httpx.get(pair.small.url + "/api/tags", timeout=10).json()["models"]
    nodes = {m["name"].rsplit("/", 1)[-1]: m["node"] for m in tags}
    assert nodes[ONLYBIG] == pair.big_name and nodes[MINE] == "local"
    ids = [m["id"] for m in httpx.get(pair.small.url + "/v1/models", timeout=10).json()["data"]]
    assert any(ONLYBIG in i for i in ids)
    assert httpx.get(pair.small.url + "/api/tags", headers=HOP, timeout=10).json()["models"][0].get(
        "node") is None
    r = httpx.post(pair.small.url + "/api/show", json={"model": ONLYBIG}, timeout=30)
    assert r.status_code == 200, r.text


def test_a_missing_model_is_copied_from_the_peer(pair: Pair) -> None:
    assert not any(ONLYBIG in m.reference for m in Store(pair.small.store).list())
    headers = HOP | {"x-llmman-source": pair.big.url}
    r = httpx.post(pair.small.url + "/api/generate", headers=headers, timeout=120,
                   json={"model": ONLYBIG, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}})
    assert r.status_code == 200, r.text
    assert any(ONLYBIG in m.reference for m in Store(pair.small.store).list())
    assert "copying" in pair.small.log_text()
    _unload_all(pair)
