"""The blob server (``llmman.api.blobserver``): ``/v2/`` blob GETs that ask for it (llmman's own pulls and
copies send ``X-Llmman-Blob-Redirect: 1``) are answered ``307`` to a signed URL on the daemon's second
port, served by ``sendfile`` from a thread; ranges, signatures, API keys at the front, TLS, a peer pull
through it, and the fallback to the main port when the blob port cannot be reached. Real daemons, the real
SmolLM2 GGUF (its weights layer is past the redirect threshold).
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from llmman.api.blobserver import MAX_CONNECTIONS
from llmman.refs import parse_reference
from llmman.registry.client import BLOB_REDIRECT
from llmman.store import Store
from tests.integration.daemons import Daemon, free_port, start_daemon
from tests.integration.holding_proxy import HoldingProxy
from tests.integration.test_aggregation_tls import make_pki

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NAME = "ai/smollm2:135m"
HOST = "127.0.0.44"  # not the holding proxies' 127.0.0.1
ASK = {BLOB_REDIRECT: "1"}


def _store(tmp: Path, model_file: Path) -> tuple[str, int]:
    """Build the model into ``tmp/store``; its weights layer's digest and size."""
    stored = Store(tmp / "store").build(parse_reference(NAME), model_file)
    layer = max(stored.manifest["layers"], key=lambda d: d["size"])
    return str(layer["digest"]), int(layer["size"])


@dataclass
class Node:
    daemon: Daemon
    digest: str  # the weights layer
    size: int
    same_port: HoldingProxy  # on 127.0.0.1 at the daemon's own port number: its redirects lead nowhere


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("node")
    digest, size = _store(tmp, model_file)
    proxy = HoldingProxy(("127.0.0.1", 1))
    proxy.target = (HOST, proxy.port)  # connected per client connection, so set before the first
    try:
        d = start_daemon(tmp, host=HOST, port=proxy.port, extra_env={"LLMMAN_DEBUG": "1"})
        try:
            yield Node(d, digest, size, proxy)
        finally:
            d.stop(signal.SIGTERM)
    finally:
        proxy.close()


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_large_blob_get_goes_to_the_blob_server(node: Node) -> None:
    d, digest, size = node.daemon, node.digest, node.size
    url = f"{d.url}/v2/ai/smollm2/blobs/{digest}"
    r = httpx.get(url, headers=ASK)
    assert r.status_code == 307, r.text
    location = urlsplit(r.headers["location"])
    assert (location.scheme, location.hostname) == ("http", HOST)
    assert location.port != urlsplit(d.url).port and location.path == f"/blobs/{digest}"
    whole = httpx.get(r.headers["location"], timeout=60)
    assert whole.status_code == 200 and int(whole.headers["content-length"]) == size
    assert _sha(whole.content) == digest and whole.headers["docker-content-digest"] == digest
    assert f"blob server: sent {digest} bytes 0-{size - 1}" in d.log_text()
    with httpx.Client(follow_redirects=True, timeout=60) as c:  # Range survives the redirect
        part = c.get(url, headers={**ASK, "Range": "bytes=1000-"})
        assert part.status_code == 206 and part.headers["content-range"] == f"bytes 1000-{size - 1}/{size}"
        assert part.content == whole.content[1000:]
        tail = c.get(r.headers["location"], headers={"Range": "bytes=-4"})  # one connection, kept alive
        assert tail.status_code == 206 and tail.content == whole.content[-4:]
        gone = c.get(r.headers["location"], headers={"Range": f"bytes={size}-"})
        assert gone.status_code == 416 and gone.headers["content-range"] == f"bytes */{size}"
        assert gone.json()["errors"][0]["code"] == "RANGE_INVALID"
        head = c.head(r.headers["location"])
        assert head.status_code == 200 and int(head.headers["content-length"]) == size and not head.content


def test_small_ranges_heads_plain_clients_and_proxies_stay_on_the_main_port(node: Node) -> None:
    d, digest, size = node.daemon, node.digest, node.size
    url = f"{d.url}/v2/ai/smollm2/blobs/{digest}"
    with httpx.Client(timeout=60) as c:
        part = c.get(url, headers={**ASK, "Range": "bytes=0-3"})
        assert part.status_code == 206 and part.content == b"GGUF"
        assert c.head(url, headers=ASK).status_code == 200
        with c.stream("GET", url) as plain:  # a client that did not ask: answered inline, as before
            assert plain.status_code == 200 and int(plain.headers["content-length"]) == size
            assert "location" not in plain.headers
        multi = c.get(url, headers={**ASK, "Range": f"bytes=0-3,{size - 4}-"})
        assert multi.status_code == 206 and "location" not in multi.headers  # several ranges: inline
    proxy = HoldingProxy((HOST, int(urlsplit(d.url).port or 0)))  # another port than the daemon's
    try:
        with httpx.stream("GET", f"http://{proxy.host}/v2/ai/smollm2/blobs/{digest}", headers=ASK) as r:
            assert r.status_code == 200 and "location" not in r.headers  # a 307 would bypass the proxy
    finally:
        proxy.close()


def test_signed_urls_are_bound_to_blob_and_expiry(node: Node) -> None:
    d, digest = node.daemon, node.digest
    location = httpx.get(f"{d.url}/v2/ai/smollm2/blobs/{digest}", headers=ASK).headers["location"]
    parts = urlsplit(location)
    query = dict(p.split("=", 1) for p in parts.query.split("&"))
    base = f"{parts.scheme}://{parts.netloc}"
    other = "sha256:" + "0" * 64
    bad = [f"{base}/blobs/{other}?{parts.query}",  # another blob, the same signature
           f"{base}/blobs/{digest}?e={int(query['e']) + 1}&s={query['s']}",  # a later expiry
           f"{base}/blobs/{digest}?e={query['e']}&s={'0' * 64}",
           f"{base}/blobs/{digest}",
           f"{base}/v2/ai/smollm2/blobs/{digest}?{parts.query}"]
    for url in bad:
        r = httpx.get(url)
        assert r.status_code == 403 and r.json()["errors"][0]["code"] == "DENIED", url
    assert httpx.post(location).status_code == 405


def test_past_its_connection_limit_the_blob_server_answers_503(node: Node) -> None:
    d, digest = node.daemon, node.digest
    location = urlsplit(httpx.get(f"{d.url}/v2/ai/smollm2/blobs/{digest}", headers=ASK).headers["location"])
    address = (location.hostname or "", location.port or 0)
    idle = [socket.create_connection(address) for _ in range(MAX_CONNECTIONS)]  # each holds a slot
    try:
        with socket.create_connection(address, timeout=30) as extra:
            deadline = time.monotonic() + 30  # the accept loop reaches it after the 64 before it
            answer = b""
            while b"\r\n\r\n" not in answer and time.monotonic() < deadline:
                if not (chunk := extra.recv(4096)):
                    break
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer, answer
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 30  # the slots come back as their threads see the connections end
    while (status := httpx.head(urlunsplit(location), timeout=30).status_code) == 503 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status == 200


def test_a_pull_from_the_node_comes_through_the_blob_server_or_falls_back(node: Node, tmp_path: Path) -> None:
    d, digest, proxy = node.daemon, node.digest, node.same_port
    node_host = d.url.removeprefix("http://")
    peer = start_daemon(tmp_path, extra_env={"LLMMAN_INSECURE_REGISTRIES": f"{node_host}, {proxy.host}",
                                             "LLMMAN_DEBUG": "1"})
    try:
        with peer.client(timeout=300) as c:
            before = d.log_text().count(f"blob server: sent {digest}")
            r = c.post("/api/pull", json={"model": f"{node_host}/{NAME}", "stream": False})
            assert r.status_code == 200, r.text
            assert d.log_text().count(f"blob server: sent {digest}") == before + 1
            assert (peer.store / "blobs" / "sha256" / digest.split(":")[1]).is_file()
            c.request("DELETE", "/api/delete", json={"model": f"{node_host}/{NAME}"}).raise_for_status()
            assert not (peer.store / "blobs" / "sha256" / digest.split(":")[1]).exists()

            r = c.post("/api/pull", json={"model": f"{proxy.host}/{NAME}", "stream": False})
            assert r.status_code == 200, r.text  # the redirect led nowhere, the retry came through the proxy
            assert d.log_text().count(f"blob server: sent {digest}") == before + 1
            assert f"blob {digest[:19]}" in peer.log_text() and "retrying" in peer.log_text()
            tags = {m["name"]: m["digest"] for m in c.get("/api/tags").json()["models"]}
            assert f"{proxy.host}/{NAME}" in tags
    finally:
        peer.stop(signal.SIGTERM)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_tls_daemon_serves_blobs_over_tls_and_keys_stay_required(tmp_path: Path, model_file: Path) -> None:
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    digest, size = _store(tmp_path, model_file)
    d = start_daemon(tmp_path, host="127.0.0.2", extra_env={
        "LLMMAN_TLS_CERT": str(pki.cert), "LLMMAN_TLS_KEY": str(pki.key), "LLMMAN_TLS_CA": str(pki.ca),
        "LLMMAN_API_KEYS": "blob-key", "LLMMAN_DEBUG": "1"})
    try:
        verify = ssl.create_default_context(cafile=str(pki.ca))
        url = f"{d.url}/v2/ai/smollm2/blobs/{digest}"
        assert httpx.get(url, headers=ASK, verify=verify).status_code == 401  # no key, no signed URL
        r = httpx.get(url, headers={**ASK, "Authorization": "Bearer blob-key"}, verify=verify)
        assert r.status_code == 307, r.text
        location = r.headers["location"]
        assert location.startswith("https://127.0.0.2:")
        with pytest.raises(httpx.HTTPError):  # the blob port speaks TLS only
            httpx.get(location.replace("https://", "http://", 1), timeout=10)
        blob = httpx.get(location, verify=verify, timeout=60)  # the signature is the credential
        assert blob.status_code == 200 and len(blob.content) == size and _sha(blob.content) == digest
        assert f"blob server: sent {digest} bytes 0-{size - 1} ({size} bytes) to 127.0.0.1 over TLS" \
            in d.log_text()
    finally:
        d.stop(signal.SIGTERM)


def test_server_blob_port_fixes_the_port_or_turns_the_server_off(tmp_path: Path, model_file: Path) -> None:
    """``server.blob_port``: a fixed port (to allow through a firewall) is the one the redirect names; one
    that is taken, and ``-1``, answer inline from the main port."""
    digest, size = _store(tmp_path, model_file)
    fixed = free_port("127.0.0.45")
    for blob_port, redirected in ((str(fixed), True), ("-1", False), (str(fixed), False)):
        taken = socket.create_server(("127.0.0.45", fixed)) if blob_port != "-1" and not redirected else None
        d = start_daemon(tmp_path / blob_port.replace("-", "off") / str(redirected), host="127.0.0.45",
                         extra_env={"LLMMAN_MODELS": str(tmp_path / "store"), "LLMMAN_BLOB_PORT": blob_port})
        try:
            url = f"{d.url}/v2/ai/smollm2/blobs/{digest}"
            r = httpx.get(url, headers=ASK, follow_redirects=False, timeout=60)
            if redirected:
                assert r.status_code == 307, r.text
                assert urlsplit(r.headers["location"]).port == fixed
                r = httpx.get(url, headers=ASK, follow_redirects=True, timeout=60)
            assert r.status_code == 200, (blob_port, r.status_code, r.headers)
            assert len(r.content) == size and _sha(r.content) == digest
        finally:
            d.stop(signal.SIGTERM)
            if taken is not None:
                taken.close()
