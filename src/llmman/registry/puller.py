"""Pulling a model by reference into the store, with Ollama-shaped progress.

Order (OCI distribution-spec 1.1): resolve the manifest (an image index picks
one entry, see :func:`manifests.choose`), verify its digest against a pinned ``@sha256:`` and the
``Docker-Content-Digest`` header, fetch config and layers :data:`PARALLEL` at a time through the shared
:class:`Downloader` (resumable, verified, single-flight per digest), and only then name the manifest in
the index. Any failure leaves the index exactly as it was (completed blobs stay as cache until gc).

Pulls of one reference are serialised by a per-reference lock and :meth:`Puller.ensure` re-checks the
store inside it (no second download of one model): however many requests wait, the model is pulled once.

Every pull and copy is listed in :attr:`Puller.transfers` (:mod:`llmman.registry.progress`) while it runs:
what, from where, bytes so far; ``/llmman/node`` and the dashboard show it.

Progress events are Ollama's ``/api/pull`` lines: ``{"status": "pulling manifest"}``, per layer
``{"status": "pulling <12 hex>", "digest", "total", "completed"}``, ``{"status": "verifying sha256
digest"}``, ``{"status": "writing manifest"}``, ``{"status": "success"}``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from llmman.errors import LlmmanError
from llmman.refs import Reference
from llmman.registry import manifests
from llmman.registry.client import (
    RegistryClient,
    RegistryError,
    RegistryOptions,
    is_loopback_host,
    reference_tag,
)
from llmman.registry.credentials import CredentialStore
from llmman.registry.download import Downloader
from llmman.registry.progress import COPY, PULL, Transfer, Transfers
from llmman.store import Store, StoredModel

PARALLEL = 6  # layers fetched at once per pull
PROGRESS_INTERVAL_S = 0.2  # at most one progress line per layer this often (plus first and last)
Emit = Callable[[dict[str, Any]], None]
__all__ = ["Emit", "Puller", "is_loopback_host"]


def _quiet(_: dict[str, Any]) -> None:
    return None


class Puller:
    """Pulls references into ``store``. One per daemon (or CLI run); thread-safe.

    Args:
        store: where models go.
        credentials: registry credentials; None = anonymous only.
        offline: refuse every registry off this machine (``server.offline``).
        options: insecure hosts, the extra CA bundle and the Hugging Face endpoint, for every pull (and
            :meth:`push`) this puller makes.
    """

    def __init__(self, store: Store, credentials: CredentialStore | None = None, *,
                 offline: bool = False, options: RegistryOptions | None = None) -> None:
        self.store = store
        self.credentials = credentials
        self.offline = offline
        self.options = options or RegistryOptions()
        self.downloader = Downloader(store)
        self.transfers = Transfers()
        self._ref_locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _ref_lock(self, ref: Reference) -> threading.Lock:
        with self._guard:
            return self._ref_locks.setdefault(ref.key(), threading.Lock())

    def ensure(self, ref: Reference, emit: Emit = _quiet, *, insecure: bool = False) -> StoredModel:
        """The stored model for ``ref``, pulling it first when absent (once, however many callers)."""
        found = self.store.find(ref)
        if found is not None:
            return found
        with self._ref_lock(ref):
            found = self.store.find(ref)
            if found is not None:
                emit({"status": "success"})
                return found
            return self._pull(ref, emit, insecure)

    def pull(self, ref: Reference, emit: Emit = _quiet, *, insecure: bool = False) -> StoredModel:
        """Pull ``ref`` even when stored (an updated tag replaces the entry; present blobs are reused)."""
        with self._ref_lock(ref):
            return self._pull(ref, emit, insecure)

    def _pull(self, ref: Reference, emit: Emit, insecure: bool) -> StoredModel:
        host = urlsplit(self.options.hf_endpoint).netloc if ref.is_huggingface else ref.registry
        if self.offline and not is_loopback_host(host):
            raise LlmmanError(f"not pulling {ref} from {host}: llmman is offline (server.offline)",
                              status=503, code="offline")
        with self.transfers.track(str(ref), PULL, host) as transfer:
            return self._pull_from(ref, transfer.feeding(emit), insecure, transfer)

    def _pull_from(self, ref: Reference, emit: Emit, insecure: bool, transfer: Transfer) -> StoredModel:
        if ref.is_huggingface:
            from llmman.registry.huggingface import pull_huggingface

            return pull_huggingface(self.store, ref, emit, endpoint=self.options.hf_endpoint,
                                    offline=self.offline)
        emit({"status": "pulling manifest"})
        client = RegistryClient(ref.registry, self.credentials, insecure=insecure, options=self.options,
                                offline=self.offline)
        try:
            data, media, manifest = self._manifest(client, ref)
            self._fetch_all(client, ref.repository, manifests.blobs(manifest), emit, transfer)
            emit({"status": "verifying sha256 digest"})
            emit({"status": "writing manifest"})
            model = self.store.put_manifest(ref, data, media)
        finally:
            client.close()
        emit({"status": "success"})
        return model

    def pull_via(self, ref: Reference, client: RegistryClient, emit: Emit = _quiet) -> StoredModel:
        """Pull ``ref``'s repository and tag through ``client`` (another registry, such as a peer
        node's ``/v2/``) and store it under ``ref`` (also when it is stored but lacks a blob: a repair).
        Single-flight with :meth:`ensure`; listed in :attr:`transfers` as a ``copy`` from the client's
        registry (the peer's ``host:port``) while it runs. The client
        trusts this puller's CA bundle (``tls.ca_file``) as well as its own. Offline, the client may
        reach only loopback hosts and its own (the peer the operator configured): no redirect or token
        realm leads elsewhere."""
        client.trust(self.options.ca_file)
        if self.offline:
            client.confine(also=client.registry)
        with self._ref_lock(ref):
            found = self.store.find(ref)
            if found is not None and not self.store.missing_blobs(found):
                return found
            with self.transfers.track(str(ref), COPY, client.registry) as transfer:
                emit = transfer.feeding(emit)
                data, media, manifest = self._manifest(client, ref)
                self._fetch_all(client, ref.repository, manifests.blobs(manifest), emit, transfer)
                return self.store.put_manifest(ref, data, media)

    def push(self, ref: Reference, emit: Emit = _quiet, *, insecure: bool = False,
             source: str | None = None) -> str:
        """Push the stored model ``ref`` to its registry with this puller's credentials and options
        (:func:`llmman.registry.push.push`); returns the manifest digest."""
        from llmman.registry.push import push

        if self.offline and not is_loopback_host(ref.registry):
            raise LlmmanError(f"not pushing {ref} to {ref.registry}: llmman is offline (server.offline)",
                              status=503, code="offline")
        return push(self.store, ref, self.credentials, emit, insecure=insecure, source=source,
                    options=self.options, offline=self.offline)

    def _manifest(self, client: RegistryClient, ref: Reference) -> tuple[bytes, str, dict[str, Any]]:
        data, media = client.get_manifest(ref.repository, reference_tag(ref))
        if ref.digest is not None and manifests.sha256_digest(data) != ref.digest:
            raise RegistryError(f"{ref}: the registry sent a manifest with digest "
                                f"{manifests.sha256_digest(data)}")
        doc, media = manifests.parse(data, media)
        if manifests.is_index(media):
            entry = manifests.choose(doc, str(ref))
            data, media = client.get_manifest(ref.repository, entry["digest"])
            if manifests.sha256_digest(data) != entry["digest"]:
                raise RegistryError(f"{ref}: manifest {entry['digest']} failed verification")
            doc, media = manifests.parse(data, media)
            if manifests.is_index(media):
                raise RegistryError(f"{ref}: nested image indexes are not supported")
        return data, media, doc

    def _fetch_all(self, client: RegistryClient, repository: str, blobs: list[manifests.Blob],
                   emit: Emit, transfer: Transfer) -> None:
        lock = threading.Lock()
        transfer.expect({b.digest: b.size for b in blobs})

        def one(blob: manifests.Blob) -> None:
            status = f"pulling {blob.digest.split(':', 1)[1][:12]}"
            last = [0.0]

            def progress(done: int) -> None:
                transfer.advance(blob.digest, done, blob.size)
                now = time.monotonic()
                if done not in (0, blob.size) and now - last[0] < PROGRESS_INTERVAL_S:
                    return
                last[0] = now
                with lock:
                    emit({"status": status, "digest": blob.digest, "total": blob.size, "completed": done})

            self.downloader.fetch(client, repository, blob.digest, blob.size, progress)

        unique = list({b.digest: b for b in blobs}.values())
        with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL, len(unique)))) as pool:
            futures = [pool.submit(one, b) for b in unique]
            errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                self.store.layout.unpin(b.digest for b in unique)
                raise error
