"""Fault: the registry connection drops in the middle of a blob (issue 13, item 6).

A real registry (Debian's ``docker-registry``) sits behind a loopback TCP proxy that cuts the first
connection carrying more than :data:`CUT_AFTER` bytes towards the client, once. The pull must retry from
the byte it had written (``Range: bytes=N-``), its progress must never go backwards, and the stored blob
must have the right digest. Before the fix the retry started from byte 0 while the file kept its first
bytes, and the pull ended with a sha256 mismatch. Both body paths are covered: ``splice(2)`` and the
buffered pipeline.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmman.refs import parse_reference
from llmman.registry import splice
from llmman.registry.client import RegistryOptions
from llmman.registry.puller import Puller
from llmman.registry.push import push
from llmman.store import Store
from llmman.store import mediatypes as mt
from tests.integration.registry import Registry, available, start_registry

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not available(), reason="docker-registry missing")]

BLOB_SIZE = 12 << 20
CUT_AFTER = 3 << 20  # bytes towards the client before the one cut


class CuttingProxy:
    """A loopback TCP proxy to ``target`` that closes the first connection whose downstream bytes pass
    ``cut_after`` (both directions at once, as a dropped link looks to the client), and passes every
    other connection through. ``heads`` keeps each request's header block as the client sent it."""

    def __init__(self, target: tuple[str, int], cut_after: int) -> None:
        self.target, self.cut_after = target, cut_after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut = threading.Event()
        self.heads: list[bytes] = []
        self._lock = threading.Lock()
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closing = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                with self._lock:
                    self.heads.extend(part for part in data.split(b"\r\n\r\n") if part.startswith(b"GET "))
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            _shut(upstream)

    def _down(self, upstream: socket.socket, client: socket.socket) -> None:
        sent = 0
        try:
            while data := upstream.recv(65536):
                if not self.cut.is_set() and sent + len(data) > self.cut_after:
                    with self._lock:
                        first = not self.cut.is_set()
                        self.cut.set()
                    if first:
                        client.sendall(data[: self.cut_after - sent])
                        return  # closes both sides: the link dropped mid-body
                client.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            _shut(client)
            _shut(upstream)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def pushed(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A model whose one layer is :data:`BLOB_SIZE` random bytes at ``ai/dropped:1``; (layer, manifest)
    digests."""
    store = Store(tmp_path_factory.mktemp("src") / "store")
    ref = parse_reference(f"{registry.host}/ai/dropped:1")
    data = os.urandom(BLOB_SIZE)
    layer = store.write_blob([data])
    config = store.write_blob([b"{}"])
    manifest = {"schemaVersion": 2, "mediaType": mt.OCI_MANIFEST,
                "config": {"mediaType": mt.DOCKER_AI_CONFIG, "digest": config, "size": 2},
                "layers": [{"mediaType": mt.DOCKER_AI_GGUF, "digest": layer, "size": len(data)}]}
    model = store.put_manifest(ref, json.dumps(manifest).encode(), mt.OCI_MANIFEST)
    push(store, ref, None, lambda _: None, options=RegistryOptions(insecure_registries=(registry.host,)))
    return layer, model.digest


@pytest.mark.parametrize("path", ["splice", "buffered"])
def test_a_dropped_connection_resumes_where_it_stopped(tmp_path: Path, registry: Registry,
                                                      pushed: tuple[str, str], path: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    layer, manifest = pushed
    if path == "buffered":
        monkeypatch.setattr(splice, "usable", lambda *_: False)
    host, port = registry.host.split(":")
    proxy = CuttingProxy((host, int(port)), CUT_AFTER)
    try:
        front = f"127.0.0.1:{proxy.port}"
        store = Store(tmp_path / "store")
        puller = Puller(store, options=RegistryOptions(insecure_registries=(front,)))
        lines: list[dict[str, Any]] = []
        model = puller.pull(parse_reference(f"{front}/ai/dropped:1"), lines.append)
    finally:
        proxy.close()
    assert proxy.cut.is_set(), "the proxy never cut a connection: the test proves nothing"
    assert model.digest == manifest
    done = [line["completed"] for line in lines if line.get("digest") == layer]
    assert done == sorted(done), f"progress went backwards: {done}"
    assert done[-1] == BLOB_SIZE
    blob_gets = [h for h in proxy.heads if f"/blobs/{layer}".encode() in h.split(b"\r\n", 1)[0]]
    assert len(blob_gets) == 2, blob_gets
    ranged = [h for h in blob_gets[1].split(b"\r\n") if h.lower().startswith(b"range:")]
    assert ranged, "the retry asked for the whole blob again"
    start = int(ranged[0].split(b"=", 1)[1].split(b"-", 1)[0])
    assert 0 < start <= CUT_AFTER
    data = store.blob_path(layer).read_bytes()
    assert "sha256:" + hashlib.sha256(data).hexdigest() == layer
    assert not list((store.root / "partial").glob("*.partial"))
