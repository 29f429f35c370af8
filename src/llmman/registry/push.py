"""Pushing a stored model to an OCI registry.

OCI distribution-spec 1.1: for each blob (config, layers) ``HEAD /v2/<name>/blobs/<digest>`` and skip it
when present; else try a cross-repository mount (``POST /v2/<name>/blobs/uploads/?mount=<d>&from=<repo>``,
201 = done) when the model was pulled from another repository of the same registry; else start an upload
session (``POST .../uploads/`` -> 202 + ``Location``) and finish it monolithically with ``PUT
<location>?digest=<d>`` streaming the blob file. Last, ``PUT /v2/<name>/manifests/<tag>``. Progress lines
follow Ollama's ``/api/push``: ``retrieving manifest``, ``pushing <12 hex>`` with ``total``/``completed``,
``pushing manifest``, ``success``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin

from llmman.refs import Reference, parse_reference
from llmman.registry import manifests
from llmman.registry.client import RegistryClient, RegistryError, RegistryNotFound, check
from llmman.registry.credentials import CredentialStore
from llmman.store import Store

Emit = Callable[[dict[str, Any]], None]
PROGRESS_INTERVAL_S = 0.2
CHUNK = 1 << 20


def _file_chunks(path: Path, on_bytes: Callable[[int], None]) -> Iterator[bytes]:
    done = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            done += len(chunk)
            yield chunk
            on_bytes(done)


def push(store: Store, ref: Reference, credentials: CredentialStore | None, emit: Emit, *,
         insecure: bool = False, source: str | None = None) -> str:
    """Upload the stored model ``ref`` to its registry; returns the manifest digest.

    ``source`` is the stored name of the model it came from, for a cross-repository mount.
    Raises ModelNotFound (not stored), RegistryError (refused, unauthorised, unreachable)."""
    emit({"status": "retrieving manifest"})
    model = store.get(ref)
    data = store.layout.read_blob(model.digest)
    media = json.loads(data).get("mediaType") or "application/vnd.oci.image.manifest.v1+json"
    repo = ref.repository
    scope = f"repository:{repo}:pull,push"
    mount_from = _mount_source(source, ref)
    client = RegistryClient(ref.registry, credentials, insecure=insecure)
    try:
        for blob in manifests.blobs(model.manifest):
            status = f"pushing {blob.digest.split(':', 1)[1][:12]}"
            emit({"status": status, "digest": blob.digest, "total": blob.size, "completed": 0})
            if not _exists(client, repo, blob.digest, scope) and not _mount(client, repo, blob, mount_from,
                                                                           scope):
                _upload(client, repo, blob, store.blob_path(blob.digest), scope,
                        _throttled(emit, status, blob))
            emit({"status": status, "digest": blob.digest, "total": blob.size, "completed": blob.size})
        emit({"status": "pushing manifest"})
        with client.request("PUT", f"/v2/{repo}/manifests/{ref.tag}", scope=scope,
                            headers={"Content-Type": media}, content=data) as response:
            check(response, f"manifest of {ref}")
    finally:
        client.close()
    emit({"status": "success"})
    return model.digest


def _throttled(emit: Emit, status: str, blob: manifests.Blob) -> Callable[[int], None]:
    last = [0.0]

    def progress(done: int) -> None:
        now = time.monotonic()
        if done == blob.size or now - last[0] >= PROGRESS_INTERVAL_S:
            last[0] = now
            emit({"status": status, "digest": blob.digest, "total": blob.size, "completed": done})

    return progress


def _mount_source(source: str | None, ref: Reference) -> str | None:
    if not source:
        return None
    try:
        src = parse_reference(source)
    except Exception:
        return None
    return src.repository if src.registry == ref.registry and src.repository != ref.repository else None


def _exists(client: RegistryClient, repo: str, digest: str, scope: str) -> bool:
    try:
        with client.request("HEAD", f"/v2/{repo}/blobs/{digest}", scope=scope) as response:
            return response.status_code == 200
    except RegistryNotFound:
        return False


def _mount(client: RegistryClient, repo: str, blob: manifests.Blob, source: str | None, scope: str) -> bool:
    if source is None:
        return False
    query = urlencode({"mount": blob.digest, "from": source})
    with client.request("POST", f"/v2/{repo}/blobs/uploads/?{query}", scope=scope) as response:
        return response.status_code == 201


def _upload(client: RegistryClient, repo: str, blob: manifests.Blob, path: Path, scope: str,
            on_bytes: Callable[[int], None]) -> None:
    with client.request("POST", f"/v2/{repo}/blobs/uploads/", scope=scope) as response:
        check(response, f"upload of {blob.digest[:19]}")
        location = response.headers.get("location")
    if not location:
        raise RegistryError(f"{client.registry}: upload of {blob.digest[:19]} got no Location")
    url = urljoin(client.base + "/", location)
    url += ("&" if "?" in url else "?") + urlencode({"digest": blob.digest})
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(blob.size)}
    with client.request("PUT", url, scope=scope, headers=headers,
                        content=_file_chunks(path, on_bytes)) as response:
        check(response, f"upload of {blob.digest[:19]}")
