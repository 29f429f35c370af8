"""Copying a model from a peer's ``/v2/`` registry instead of the internet.

When the router (:mod:`.router`) serves a request here and a peer stores the model, or a forwarded
request names a source in ``x-llmman-source``, its decision carries a :class:`PullSource`; the gateway's
``ensure`` then calls :func:`copy_from_peer` before falling back to the model's own registry. While it
runs, the copy is listed in the puller's transfers (``kind`` ``copy``, ``source`` the peer's ``host:port``;
llmman.registry.progress), which ``/llmman/node`` publishes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from llmman.config.table import HostAddress
from llmman.refs import Reference
from llmman.registry.client import RegistryClient, RegistryError, RegistryOptions
from llmman.registry.manifests import sha256_digest
from llmman.registry.puller import Puller
from llmman.store import StoredModel

log = logging.getLogger("llmman.cluster")


@dataclass(frozen=True)
class PullSource:
    """A peer to copy from, the key to present to it (empty = none) and the manifest digest the copy
    must have (``sha256:...``; empty = any)."""

    address: HostAddress
    api_key: str = ""
    digest: str = ""


class _PeerRegistry(RegistryClient):
    """A peer's ``/v2/`` with the peer key on every request, blob downloads included (they go through
    :meth:`auth_headers`, not the httpx client's default headers)."""

    def __init__(self, address: HostAddress, api_key: str, digest: str = "",
                 options: RegistryOptions | None = None) -> None:
        super().__init__(address.netloc, insecure=address.scheme == "http", options=options)
        self._peer_key = api_key
        self._digest = digest

    def get_manifest(self, repository: str, reference: str) -> tuple[bytes, str]:
        """The peer's manifest; the one asked for by tag must have the pinned digest.

        Raises:
            RegistryError: it has another digest (the peer stores something else under that name).
        """
        data, media = super().get_manifest(repository, reference)
        if self._digest and not reference.startswith("sha256:") and sha256_digest(data) != self._digest:
            raise RegistryError(f"{repository}:{reference}: the peer sent manifest {sha256_digest(data)}, "
                                f"not the {self._digest} the forwarding node stores")
        return data, media

    def _auth_headers(self, scope: str) -> dict[str, str]:
        if self._peer_key:
            return {"Authorization": f"Bearer {self._peer_key}"}
        return super()._auth_headers(scope)


def copy_from_peer(puller: Puller, ref: Reference, source: PullSource) -> StoredModel:
    """Pull ``ref`` from ``source``'s ``/v2/`` into this node's store (blocking; run it in a thread).

    Raises:
        LlmmanError (RegistryError and kin): the peer does not have it, failed, or sent a manifest
            other than ``source.digest``.
    """
    address = source.address
    client = _PeerRegistry(address, source.api_key, source.digest, puller.options)
    try:
        log.info("copying %s from peer %s", ref, address.netloc)
        return puller.pull_via(ref, client)
    finally:
        client.close()
