"""The node's own store as a read-only OCI registry (OCI distribution-spec 1.1, "Pull" category only).

``GET /v2/`` answers 200 ``{}`` with ``Docker-Distribution-Api-Version: registry/2.0``.
``GET|HEAD /v2/<name>/manifests/<tag|digest>`` serves a stored manifest: ``<name>`` is matched against
the stored references' repository (``ai/smollm2``) or ``registry/repository``
(``docker.io/ai/smollm2``, since a path cannot hold ``:``, only port-less registries), case-insensitively.
``GET|HEAD /v2/<name>/blobs/<digest>`` serves any blob a stored manifest of that name reaches, honouring
``Range`` (206). Errors use the spec's JSON shape ``{"errors": [{"code", "message"}]}``. Writes are not
offered (405). The same authentication as the rest of the API applies.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from llmman.api.services import Services
from llmman.errors import StoreError
from llmman.store import StoredModel
from llmman.store.model import descriptor_digests

API_HEADER = {"Docker-Distribution-Api-Version": "registry/2.0"}


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
        return _blob(services, *parts)
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
    media = str(json.loads(data).get("mediaType") or "application/vnd.oci.image.manifest.v1+json")
    headers = {**API_HEADER, "Docker-Content-Digest": digest}
    return Response(data, media_type=media, headers=headers)


def _blob(services: Services, name: str, digest: str) -> Response:
    models = _candidates(services, name)
    if not any(digest in descriptor_digests(m.manifest) or digest == m.digest for m in models):
        return _error(404, "BLOB_UNKNOWN", f"blob {digest} not found in {name}")
    try:
        path = services.store.blob_path(digest)
    except StoreError as exc:
        return _error(400, "DIGEST_INVALID", exc.message)
    if not path.is_file():
        return _error(404, "BLOB_UNKNOWN", f"blob {digest} not found")
    headers = {**API_HEADER, "Docker-Content-Digest": digest}
    return FileResponse(path, media_type="application/octet-stream", headers=headers)
