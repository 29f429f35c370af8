"""What a forward sends a peer (cluster/forward.py): only the client headers a peer needs."""

from __future__ import annotations

from typing import cast

import aiohttp

from llmman.cluster.forward import forward_headers
from llmman.cluster.peers import HOP, Peers

CLIENT = [
    ("Content-Type", "application/json"), ("Accept", "text/event-stream"), ("User-Agent", "anthropic-py"),
    ("anthropic-version", "2023-06-01"), ("Cookie", "session=secret"), ("Proxy-Authorization", "Basic x"),
    ("Authorization", "Bearer client-key"), ("x-api-key", "client-key"), ("x-goog-api-key", "k"),
    ("Host", "front:17434"), ("Connection", "keep-alive"), ("Transfer-Encoding", "chunked"),
    ("x-llmman-source", "http://evil:1"), ("x-llmman-source-digest", "sha256:" + "0" * 64),
    ("X-Forwarded-For", "10.0.0.1"), ("Accept-Encoding", "gzip"),
]


def peers(key: str = "peer-key") -> Peers:
    return Peers(cast(aiohttp.ClientSession, None), (), api_key=key)


def test_cookies_credentials_and_hop_by_hop_headers_stay_here() -> None:
    sent = {k.lower(): v for k, v in forward_headers(CLIENT, peers()).items()}
    assert sent == {
        "content-type": "application/json", "accept": "text/event-stream", "user-agent": "anthropic-py",
        "anthropic-version": "2023-06-01", HOP: "1", "authorization": "Bearer peer-key",
        "accept-encoding": "identity",
    }


def test_the_copy_source_is_ours_never_the_clients() -> None:
    sent = forward_headers(CLIENT, peers(""), "http://127.0.0.2:17434", "sha256:" + "a" * 64)
    assert sent["x-llmman-source"] == "http://127.0.0.2:17434"
    assert sent["x-llmman-source-digest"] == "sha256:" + "a" * 64
    assert "authorization" not in {k.lower() for k in sent}
