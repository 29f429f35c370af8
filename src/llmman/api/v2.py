"""The node's own store as a read-only OCI registry (OCI distribution-spec 1.1, "Pull" category only).

``GET /v2/`` answers 200 ``{}`` with ``Docker-Distribution-Api-Version: registry/2.0``.
``GET|HEAD /v2/<name>/manifests/<tag|digest>`` serves a stored manifest: ``<name>`` is matched against
the stored references' repository (``ai/smollm2``) or ``registry/repository``
(``docker.io/ai/smollm2``, since a path cannot hold ``:``, only port-less registries), case-insensitively.
``GET|HEAD /v2/<name>/blobs/<digest>`` serves any blob a stored manifest of that name reaches, honouring
``Range`` per RFC 9110 (206; an invalid header is ignored, an unsatisfiable one is 416, see
:mod:`llmman.api.byteranges`). ``GET /v2/<name>/tags/list`` lists the name's tags in lexical order, with
the spec's ``n``/``last`` pagination and a ``Link: <...>; rel="next"`` header when more remain. A blob is
served only when it is verified (:meth:`llmman.store.layout.Layout.verify_blob`: unchanged since its bytes
were last hashed, else hashed now); a corrupt one is removed and answered 404 ``BLOB_UNKNOWN``, so a peer
copying it falls back to the model's registry. A GET of a large blob (:data:`REDIRECT_MIN` bytes or
more to send) from a client that sends ``X-Llmman-Blob-Redirect: 1`` (llmman's own pulls and copies) is
answered ``307`` to a short-lived signed URL of the daemon's blob server
(:mod:`llmman.api.blobserver`: ``sendfile(2)`` from a thread, off the event loop). Errors use
the spec's JSON shape ``{"errors": [{"code", "message"}]}``. Writes are not offered (405). The same
authentication as the rest of the API applies.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.types import Receive, Scope, Send

from llmman.api.blobserver import blob_server
from llmman.api.byteranges import RangeDecision, decide
from llmman.api.services import Services
from llmman.errors import StoreError
from llmman.registry.client import BLOB_REDIRECT
from llmman.store import StoredModel
from llmman.store.model import descriptor_digests

API_HEADER = {"Docker-Distribution-Api-Version": "registry/2.0"}
log = logging.getLogger(__name__)
REDIRECT_MIN = 8 << 20  # bytes to send from which a blob GET that asks for it is redirected


def _error(status: int, code: str, message: str) -> Response:
    body = {"errors": [{"code": code, "message": message}]}
    return JSONResponse(body, status_code=status, headers=API_HEADER)


async def base(request: Request) -> Response:
    """``GET /v2/``."""
    return JSONResponse({}, headers=API_HEADER)


def _candidates(services: Services, name: str) -> list[StoredModel]:
    name = name.lower()
    out = []
    for model in services.store.list():
        stored = model.reference.rsplit(":", 1)[0].lower()
        repository = stored.partition("/")[2]
        if name in (repository, stored):
            out.append(model)
    return out


def _split(path: str, kind: str) -> tuple[str, str] | None:
    marker = f"/{kind}/"
    if marker not in path:
        return None
    name, _, ref = path.rpartition(marker)
    return (name, ref) if name and ref else None


async def route(request: Request) -> Response:
    """``/v2/<name>/manifests/<ref>`` and ``/v2/<name>/blobs/<digest>`` (GET and HEAD)."""
    services: Services = request.app.state.services
    path = str(request.path_params["path"])
    if request.method not in ("GET", "HEAD"):
        return _error(405, "UNSUPPORTED", "this registry is read-only")
    if (parts := _split(path, "manifests")) is not None:
        return _manifest(services, *parts)
    if (parts := _split(path, "blobs")) is not None:
        return await _blob(request, services, *parts)
    if (parts := _split(path, "tags")) is not None and parts[1] == "list":
        return _tags(services, parts[0], request.query_params.get("n"), request.query_params.get("last"))
    return _error(404, "NAME_UNKNOWN", f"unknown path /v2/{path}")


def _manifest(services: Services, name: str, ref: str) -> Response:
    models = _candidates(services, name)
    if not models:
        return _error(404, "NAME_UNKNOWN", f"repository {name} not known")
    if ref.startswith("sha256:"):
        match = next((m for m in models if m.digest == ref), None)
        if match is None:
            reach = {d for m in models for d in descriptor_digests(m.manifest)}
            if ref not in reach:
                return _error(404, "MANIFEST_UNKNOWN", f"manifest {ref} not found")
            digest = ref
        else:
            digest = match.digest
    else:
        match = next((m for m in models if m.reference.rsplit(":", 1)[1].lower() == ref.lower()), None)
        if match is None:
            return _error(404, "MANIFEST_UNKNOWN", f"manifest {name}:{ref} not found")
        digest = match.digest
    try:
        data = services.store.layout.read_blob(digest)
    except StoreError as exc:
        return _error(404, "MANIFEST_UNKNOWN", exc.message)
    if f"sha256:{hashlib.sha256(data).hexdigest()}" != digest:
        services.store.layout.verify_blob(digest, force=True)  # removes it
        return _error(404, "MANIFEST_UNKNOWN", f"manifest {digest} failed verification")
    media = str(json.loads(data).get("mediaType") or "application/vnd.oci.image.manifest.v1+json")
    headers = {**API_HEADER, "Docker-Content-Digest": digest}
    return Response(data, media_type=media, headers=headers)


def _tags(services: Services, name: str, n: str | None, last: str | None) -> Response:
    """OCI distribution-spec 1.1 "Listing tags": ``{"name", "tags"}``, lexical order, tags after
    ``last``, at most ``n`` (400 ``PAGINATION_NUMBER_INVALID`` unless a non-negative integer)."""
    models = _candidates(services, name)
    if not models:
        return _error(404, "NAME_UNKNOWN", f"repository {name} not known")
    tags = sorted({m.reference.rsplit(":", 1)[1] for m in models})
    if last is not None:
        tags = [t for t in tags if t > last]
    headers = dict(API_HEADER)
    if n is not None:
        if not n.isdigit() or len(n) > 9:
            return _error(400, "PAGINATION_NUMBER_INVALID", f"n must be a non-negative integer, not {n!r}")
        count = int(n)
        if count < len(tags):
            tags = tags[:count]
            if tags:
                query = urlencode({"n": count, "last": tags[-1]})
                headers["Link"] = f'</v2/{name}/tags/list?{query}>; rel="next"'
    return JSONResponse({"name": name, "tags": tags}, headers=headers)


class _BlobFile(FileResponse):
    """A FileResponse that answers the given (normalised) ``Range``, or none, instead of the request's,
    read in 1 MiB chunks (Starlette's 64 KiB cost a thread hop and a loop iteration per 64 KiB)."""

    chunk_size = 1 << 20

    def __init__(self, *args: object, range_value: str | None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.range_value = range_value

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"range", b"if-range")]
        if self.range_value is not None:
            headers.append((b"range", self.range_value.encode("latin-1")))
        await super().__call__({**scope, "headers": headers}, receive, send)


async def _blob(request: Request, services: Services, name: str, digest: str) -> Response:
    range_header = request.headers.get("range")
    models = _candidates(services, name)
    if not any(digest in descriptor_digests(m.manifest) or digest == m.digest for m in models):
        return _error(404, "BLOB_UNKNOWN", f"blob {digest} not found in {name}")
    try:
        path = services.store.blob_path(digest)
        state = await asyncio.to_thread(services.store.layout.verify_blob, digest)
        if state == "corrupt":
            return _error(404, "BLOB_UNKNOWN", f"blob {digest} failed verification")
        size = path.stat().st_size
    except StoreError as exc:
        return _error(400, "DIGEST_INVALID", exc.message)
    except OSError:
        return _error(404, "BLOB_UNKNOWN", f"blob {digest} not found")
    decision = decide(range_header, size)
    headers = {**API_HEADER, "Docker-Content-Digest": digest}
    if decision.unsatisfiable:
        body = {"errors": [{"code": "RANGE_INVALID", "message": f"range {range_header} not satisfiable "
                            f"for {size} bytes"}]}
        return JSONResponse(body, status_code=416, headers={**headers, "Content-Range": f"bytes */{size}"})
    if _redirects(request, decision, size):
        try:
            return _redirect(request, services, digest, headers)
        except OSError as exc:  # server.blob_port taken, say: the blob goes inline, as without the server
            log.warning("blob server unavailable (server.blob_port %d): %s; serving %s inline",
                        services.settings.blob_port, exc, digest)
    return _BlobFile(path, media_type="application/octet-stream", headers=headers,
                     range_value=decision.header())


def _redirects(request: Request, decision: RangeDecision, size: int) -> bool:
    """Whether a blob GET goes to the blob server (:mod:`llmman.api.blobserver`): the client asked for it
    (:data:`llmman.registry.client.BLOB_REDIRECT`, which llmman's own pulls and copies send), it reached
    this daemon's own port (:func:`_reached_directly`), it is not a HEAD, it asks for at most one range,
    and there are at least :data:`REDIRECT_MIN` bytes to send (below that the extra round trip costs more
    than the event loop's copy)."""
    if request.method != "GET" or request.headers.get(BLOB_REDIRECT) != "1" or not _reached_directly(request):
        return False
    if request.app.state.services.settings.blob_port < 0:  # server.blob_port = -1: off, always inline
        return False
    if decision.ranges is None:
        return size >= REDIRECT_MIN
    if len(decision.ranges) != 1:
        return False
    first, last = decision.ranges[0]
    return last - first + 1 >= REDIRECT_MIN


def _reached_directly(request: Request) -> bool:
    """True when the port the client named (``Host``) is the one this daemon listens on: else a proxy or
    a port mapping is in between, which would not pass the blob server's port either."""
    server = request.scope.get("server")
    if not server or server[1] is None:
        return False
    named = request.url.port or (443 if request.url.scheme == "https" else 80)
    return bool(named == server[1])


def _redirect(request: Request, services: Services, digest: str, headers: dict[str, str]) -> Response:
    """``307`` to a signed URL of this daemon's blob server, on the host the client reached us by."""
    settings = services.settings
    server = blob_server(request.app, services.store, settings.host.bind_host, settings.cert_file,
                         settings.key_file, settings.blob_port)
    host = request.url.hostname or settings.host.host
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if server.tls is not None else "http"
    location = f"{scheme}://{host}:{server.port}{server.signed_path(digest)}"
    return Response(status_code=307, headers={**headers, "Location": location, "Cache-Control": "no-store"})
