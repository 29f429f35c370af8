"""Fault: an offline node is pointed off the machine by a loopback registry or hub (issue 13, item 7).

With ``server.offline`` a pull may only reach this machine. A loopback registry that answers with a token
realm, a redirect of a manifest or of a blob (as registries do to their storage), or an upload location
on another host, and a loopback Hugging Face endpoint that redirects a file to a CDN, must each be refused
*before any connection* to that host. The other host is ``192.0.2.1`` (TEST-NET-1, RFC 5737) or a name
under ``.example``: an audit hook in this module records, and blocks, every non-loopback ``connect`` and
every name lookup, so no packet leaves even if the guard is broken. Before the fix each of them was
contacted.

Also: a registry's error body is summarised (status, the OCI error code, a short cleaned message), never
relayed raw.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from llmman.errors import LlmmanError
from llmman.refs import parse_reference
from llmman.registry.client import RegistryOptions
from llmman.registry.puller import Puller
from llmman.store import Store
from llmman.store import mediatypes as mt
from tests.fakes.fake_hf_hub import FakeHub

ELSEWHERE = "192.0.2.1"  # TEST-NET-1: never to be contacted
_seen: dict[str, list[Any]] = {"connects": [], "lookups": []}
_armed = threading.Event()


def _audit(event: str, args: tuple[Any, ...], _armed: threading.Event = _armed,
           _seen: dict[str, list[Any]] = _seen) -> None:
    # The hook outlives the module (audit hooks cannot be removed): it holds its own references, so it
    # still works while the interpreter tears module globals down at exit.
    if not _armed.is_set():
        return
    if event == "socket.connect":
        address = args[1]
        if isinstance(address, tuple) and address:
            try:
                loopback = ipaddress.ip_address(str(address[0]).split("%")[0]).is_loopback
            except ValueError:
                loopback = False
            if not loopback:
                _seen["connects"].append(address)
                raise ConnectionRefusedError(f"test guard: no connection to {address[0]}")
    elif event == "socket.getaddrinfo" and str(args[0]).endswith(".example"):
        _seen["lookups"].append(args[0])
        raise socket.gaierror(f"test guard: no lookup of {args[0]}")


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def no_traffic_off_the_machine() -> Iterator[dict[str, list[Any]]]:
    """Arms the audit hook for the test; the test then asserts nothing was attempted."""
    _seen["connects"].clear()
    _seen["lookups"].clear()
    _armed.set()
    try:
        yield _seen
    finally:
        _armed.clear()


LAYER = b"GGUF" + bytes(range(256)) * 16
LAYER_DIGEST = "sha256:" + hashlib.sha256(LAYER).hexdigest()
CONFIG = b"{}"
MANIFEST = json.dumps({
    "schemaVersion": 2, "mediaType": mt.OCI_MANIFEST,
    "config": {"mediaType": mt.DOCKER_AI_CONFIG, "digest": "sha256:" + hashlib.sha256(CONFIG).hexdigest(),
               "size": len(CONFIG)},
    "layers": [{"mediaType": mt.DOCKER_AI_GGUF, "digest": LAYER_DIGEST, "size": len(LAYER)}],
}).encode()
Answer = tuple[int, dict[str, str], bytes]


class FakeRegistry:
    """A loopback registry whose answers the test chooses: ``answer(method, path)`` returns a status,
    headers and body, or None for the normal answer (``/v2/``, the manifest, its blobs)."""

    def __init__(self, answer: Callable[[str, str], Answer | None]) -> None:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                status, headers, body = answer(self.command, self.path) or registry.normal(self.path)
                self.send_response(status)
                for k, v in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_POST = do_PUT = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def normal(path: str) -> Answer:
        if path.endswith("/manifests/1"):
            return 200, {"Content-Type": mt.OCI_MANIFEST}, MANIFEST
        for body in (LAYER, CONFIG):
            if path.endswith(f"/blobs/sha256:{hashlib.sha256(body).hexdigest()}"):
                return 200, {"Content-Type": "application/octet-stream"}, body
        return 200, {"Content-Type": "application/json"}, b"{}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _pull(tmp_path: Path, answer: Callable[[str, str], Answer | None]) -> tuple[Store, LlmmanError]:
    registry = FakeRegistry(answer)
    store = Store(tmp_path / "store")
    try:
        puller = Puller(store, offline=True, options=RegistryOptions(insecure_registries=(registry.host,)))
        with pytest.raises(LlmmanError) as err:
            puller.pull(parse_reference(f"{registry.host}/ai/x:1"))
    finally:
        registry.close()
    assert store.list() == []
    return store, err.value


def _realm(method: str, path: str) -> Answer | None:
    if path.startswith("/v2/ai/"):
        return 401, {"WWW-Authenticate": f'Bearer realm="http://{ELSEWHERE}/token",service="x"'}, b""
    return None


def _manifest_redirect(method: str, path: str) -> Answer | None:
    if "/manifests/" in path:
        return 307, {"Location": f"http://{ELSEWHERE}/manifest"}, b""
    return None


def _blob_redirect(where: str) -> Callable[[str, str], Answer | None]:
    def answer(method: str, path: str) -> Answer | None:
        if method == "GET" and path.endswith(LAYER_DIGEST):
            return 307, {"Location": f"http://{where}/storage/blob?sig=1"}, b""
        return None

    return answer


@pytest.mark.parametrize(("answer", "where"), [
    (_realm, ELSEWHERE), (_manifest_redirect, ELSEWHERE), (_blob_redirect(ELSEWHERE), ELSEWHERE),
    (_blob_redirect("storage.example"), "storage.example"),
], ids=["token-realm", "manifest-redirect", "blob-redirect", "blob-redirect-to-a-name"])
def test_offline_refuses_before_connecting(tmp_path: Path, answer: Callable[[str, str], Answer | None],
                                           where: str, no_traffic_off_the_machine: dict[str, list[Any]]
                                           ) -> None:
    _, error = _pull(tmp_path, answer)
    assert no_traffic_off_the_machine == {"connects": [], "lookups": []}
    assert "offline" in error.message and where in error.message, error.message


def test_offline_push_refuses_an_upload_location_elsewhere(tmp_path: Path,
                                                          no_traffic_off_the_machine: dict[str, list[Any]]
                                                          ) -> None:
    def answer(method: str, path: str) -> Answer | None:
        if method == "HEAD" and "/blobs/" in path:
            return 404, {}, b""
        if method == "POST" and "/blobs/uploads/" in path:
            return 202, {"Location": f"http://{ELSEWHERE}/upload/1"}, b""
        return None

    registry = FakeRegistry(answer)
    store = Store(tmp_path / "store")
    ref = parse_reference(f"{registry.host}/ai/x:1")
    store.write_blob([LAYER])
    store.write_blob([CONFIG])
    store.put_manifest(ref, MANIFEST, mt.OCI_MANIFEST)
    try:
        puller = Puller(store, offline=True, options=RegistryOptions(insecure_registries=(registry.host,)))
        with pytest.raises(LlmmanError, match="offline") as err:
            puller.push(ref)
    finally:
        registry.close()
    assert no_traffic_off_the_machine == {"connects": [], "lookups": []}
    assert ELSEWHERE in err.value.message


class RedirectingHub(FakeHub):
    """The fake Hub, but every file download is a redirect to a CDN on another host."""

    def handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        if "/resolve/" not in h.path:
            return super().handle(h, head)
        data = next(iter(self.repos.values()))["tiny-Q4_K_M.gguf"]
        etag = hashlib.sha256(data).hexdigest()
        headers = {"Location": f"http://{ELSEWHERE}/cdn/blob", "X-Repo-Commit": "0" * 40, "ETag": f'"{etag}"',
                   "X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))}
        self._send(h, 302, b"", headers, head)


def test_offline_hugging_face_refuses_a_cdn_redirect(tmp_path: Path,
                                                    no_traffic_off_the_machine: dict[str, list[Any]]) -> None:
    hub = RedirectingHub({"owner/tiny-GGUF": {"tiny-Q4_K_M.gguf": LAYER}})
    store = Store(tmp_path / "store")
    try:
        puller = Puller(store, offline=True, options=RegistryOptions(hf_endpoint=hub.url))
        with pytest.raises(LlmmanError, match="offline") as err:
            puller.pull(parse_reference("hf.co/owner/tiny-GGUF"))
    finally:
        hub.close()
    assert no_traffic_off_the_machine == {"connects": [], "lookups": []}
    assert ELSEWHERE in err.value.message
    assert store.list() == []


SECRET = "Traceback (most recent call last): /srv/internal/registry.py line 12 password=hunter2 " * 20


@pytest.mark.parametrize(("status", "body", "kept"), [
    (500, SECRET.encode(), "500"),
    (400, json.dumps({"errors": [{"code": "MANIFEST_INVALID", "message": "bad\x1b[31m manifest " + SECRET}]}
                     ).encode(), "MANIFEST_INVALID"),
    (502, b"<html><body>" + SECRET.encode() + b"</body></html>", "502"),
])
def test_registry_error_bodies_are_summarised(tmp_path: Path, status: int, body: bytes, kept: str) -> None:
    def answer(method: str, path: str) -> Answer | None:
        if "/manifests/" in path:
            return status, {"Content-Type": "text/plain"}, body
        return None

    _, error = _pull(tmp_path, answer)
    assert kept in error.message
    assert "hunter2" not in error.message and "Traceback" not in error.message and "\x1b" not in error.message
    assert len(error.message) < 200, error.message
