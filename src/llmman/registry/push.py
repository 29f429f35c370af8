"""Pushing a stored model to an OCI registry.

OCI distribution-spec 1.1: for each blob (config, layers) ``HEAD /v2/<name>/blobs/<digest>`` and skip it
when present; else try a cross-repository mount (``POST /v2/<name>/blobs/uploads/?mount=<d>&from=<repo>``,
201 = done) from each other repository of the same registry that a stored model holding that blob is
named after (pulled from or pushed to it; at most :data:`MOUNT_TRIES`); else start an upload session
(``POST .../uploads/`` -> 202 + ``Location``; a refused mount answers 202 with a session, which is used)
and finish it monolithically with ``PUT <location>?digest=<d>`` streaming the blob file. Last, ``PUT
/v2/<name>/manifests/<tag>``. Progress lines follow Ollama's ``/api/push``: ``retrieving manifest``,
``pushing <12 hex>`` with ``total``/``completed``, ``pushing manifest``, ``success``.
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
from llmman.registry.client import RegistryClient, RegistryError, RegistryNotFound, RegistryOptions, check
from llmman.registry.credentials import CredentialStore
from llmman.store import Store

Emit = Callable[[dict[str, Any]], None]
PROGRESS_INTERVAL_S = 0.2
CHUNK = 1 << 20
MOUNT_TRIES = 3  # source repositories tried per blob


def _file_chunks(path: Path, on_bytes: Callable[[int], None]) -> Iterator[bytes]:
    done = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            done += len(chunk)
            yield chunk
            on_bytes(done)


def push(store: Store, ref: Reference, credentials: CredentialStore | None, emit: Emit, *,
         insecure: bool = False, source: str | None = None, options: RegistryOptions | None = None,
         offline: bool = False) -> str:
    """Upload the stored model ``ref`` to its registry; returns the manifest digest.

    ``source`` is the stored name of the model it came from, for a cross-repository mount; ``options``
    the configured insecure hosts and CA bundle (:class:`RegistryOptions`); ``offline`` keeps every
    connection on this machine (upload locations included, :meth:`RegistryClient.check_destination`).
    Raises ModelNotFound (not stored), RegistryError (refused, unauthorised, unreachable)."""
    emit({"status": "retrieving manifest"})
    model = store.get(ref)
    data = store.layout.read_blob(model.digest)
    media = json.loads(data).get("mediaType") or "application/vnd.oci.image.manifest.v1+json"
    repo = ref.repository
    scope = f"repository:{repo}:pull,push"
    sources = mount_sources(store, ref, source)
    client = RegistryClient(ref.registry, credentials, insecure=insecure, options=options, offline=offline)
    try:
        for blob in manifests.blobs(model.manifest):
            status = f"pushing {blob.digest.split(':', 1)[1][:12]}"
            emit({"status": status, "digest": blob.digest, "total": blob.size, "completed": 0})
            if not _exists(client, repo, blob.digest, scope):
                session = _mount(client, repo, blob, sources.get(blob.digest, []), scope)
                if session is not None:
                    _upload(client, repo, blob, store.blob_path(blob.digest), scope,
                            _throttled(emit, status, blob), session or None)
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


def mount_sources(store: Store, ref: Reference, source: str | None = None) -> dict[str, list[str]]:
    """Blob digest -> other repositories of ``ref``'s registry that may hold it: ``source`` (a stored name)
    first, then every stored model named on that registry whose manifest lists the blob."""
    found: dict[str, list[str]] = {}
    names = ([source] if source else []) + [m.reference for m in store.list()]
    for name in names:
        try:
            other = parse_reference(name)
            model = store.find(other)
        except Exception:  # a name that does not parse (any more) mounts nothing
            continue
        if model is None or other.registry != ref.registry or other.repository == ref.repository:
            continue
        for blob in manifests.blobs(model.manifest):
            repos = found.setdefault(blob.digest, [])
            if other.repository not in repos:
                repos.append(other.repository)
    return found


def _exists(client: RegistryClient, repo: str, digest: str, scope: str) -> bool:
    try:
        with client.request("HEAD", f"/v2/{repo}/blobs/{digest}", scope=scope) as response:
            return response.status_code == 200
    except RegistryNotFound:
        return False


def _mount(client: RegistryClient, repo: str, blob: manifests.Blob, sources: list[str],
           scope: str) -> str | None:
    """Try to mount ``blob`` from each of ``sources``; None when one did (201), else an upload session
    URL a refused mount opened (202 + Location), or "" when none was opened."""
    for source in sources[:MOUNT_TRIES]:
        query = urlencode({"mount": blob.digest, "from": source})
        mount_scope = f"{scope} repository:{source}:pull"
        with client.request("POST", f"/v2/{repo}/blobs/uploads/?{query}", scope=mount_scope) as response:
            if response.status_code == 201:
                return None
            if response.status_code == 202 and response.headers.get("location"):
                return str(response.headers["location"])
    return ""


def _upload(client: RegistryClient, repo: str, blob: manifests.Blob, path: Path, scope: str,
            on_bytes: Callable[[int], None], location: str | None = None) -> None:
    if location is None:
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
