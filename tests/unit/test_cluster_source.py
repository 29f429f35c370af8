"""Which peer ``x-llmman-source`` may name (only configured ones), the digest pin, the peer list's checks."""

from __future__ import annotations

import logging

import pytest

from llmman.cluster import copy
from llmman.cluster.peers import parse_peers
from llmman.cluster.placement import NodeView
from llmman.cluster.source import configured_source, is_self, source_digest, storing_peer
from llmman.config.table import parse_host, split_list
from llmman.errors import ConfigError
from llmman.registry.client import RegistryClient, RegistryError
from llmman.registry.manifests import sha256_digest

PEERS = parse_peers(split_list("http://127.0.0.11:17500, https://Asahi:9000, [::1]:7000"))


@pytest.mark.parametrize(("value", "client", "expected"), [
    ("http://127.0.0.11:17500", None, "127.0.0.11:17500"),
    ("127.0.0.11:17500", "10.9.9.9", "127.0.0.11:17500"),  # no scheme = http
    ("https://asahi:9000", None, "Asahi:9000"),  # host case does not matter
    ("http://[0:0::1]:7000", None, "[::1]:7000"),  # IPv6 compared as addresses
    ("http://*:17500", "127.0.0.11", "127.0.0.11:17500"),
    ("http://*:7000", "::1", "[::1]:7000"),
    ("http://*:17500", "127.0.0.1", None),  # the connection came from an address no peer has
    ("http://*:17501", "127.0.0.11", None),  # wrong port
    ("http://*:17500", None, None),
    ("https://127.0.0.11:17500", None, None),  # wrong scheme
    ("http://127.0.0.15:8080", None, None),  # the attacker's host
    ("http://asahi:9000", None, None),
    ("ftp://x", None, None),
    ("http://", None, None),
])
def test_only_configured_peers_are_sources(value: str, client: str | None, expected: str | None) -> None:
    found = configured_source(value, client, PEERS)
    assert (found.netloc if found else None) == expected


def test_source_digest_only_takes_a_sha256() -> None:
    good = "sha256:" + "ab" * 32
    assert source_digest(good) == good
    assert source_digest(good.upper().replace("SHA256", "sha256")) == good
    assert source_digest("sha256:abc") == "" and source_digest(None) == ""
    assert source_digest("md5:" + "a" * 32) == ""


def test_storing_peer_is_a_configured_one() -> None:
    views = [NodeView("evil:1", 0, {}, {"docker.io/ai/m:1": 5}),
             NodeView("127.0.0.11:17500", 0, {}, {"docker.io/ai/M:1": 5})]
    assert storing_peer("docker.io/ai/m:1", views, PEERS) == parse_host("127.0.0.11:17500")
    assert storing_peer("docker.io/ai/other:1", views, PEERS) is None


def test_empty_host_is_a_config_error() -> None:
    for text in ("http://", "https://:9000", ":9000", "a, http://"):
        with pytest.raises(ConfigError, match="names no host"):
            parse_peers(split_list(text))
    assert parse_peers(split_list("::1")) == (parse_host("[::1]:17434"),)


def test_a_node_naming_itself_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    own = parse_host("127.0.0.11:17500")
    with caplog.at_level(logging.INFO, "llmman.cluster"):
        both = split_list("127.0.0.11:17500, 127.0.0.12:17500")
        assert parse_peers(both, own) == (parse_host("127.0.0.12:17500"),)
    assert "127.0.0.11:17500 is this node itself" in caplog.text
    wildcard = parse_host("0.0.0.0:17500")
    assert is_self(parse_host("localhost:17500"), wildcard)
    assert is_self(parse_host("127.0.0.1:17500"), wildcard)
    assert not is_self(parse_host("10.0.0.5:17500"), wildcard)
    assert not is_self(parse_host("127.0.0.11:17501"), own)


def test_a_copy_pinned_to_a_digest_refuses_another_manifest(monkeypatch: pytest.MonkeyPatch) -> None:
    data = b'{"schemaVersion": 2}'
    monkeypatch.setattr(RegistryClient, "get_manifest", lambda self, repo, ref: (data, "application/json"))
    right = copy._PeerRegistry(parse_host("127.0.0.11:17500"), "k", sha256_digest(data))
    assert right.get_manifest("ai/m", "1") == (data, "application/json")
    wrong = copy._PeerRegistry(parse_host("127.0.0.11:17500"), "k", "sha256:" + "0" * 64)
    with pytest.raises(RegistryError, match="not the sha256:0000"):
        wrong.get_manifest("ai/m", "1")
    assert wrong.get_manifest("ai/m", sha256_digest(data))[0] == data  # by digest: the puller checks it
    for client in (right, wrong):
        client.close()
