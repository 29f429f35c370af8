"""Copying a model from a peer's ``/v2/`` registry instead of the internet.

The daemon's request path sets :data:`PULL_SOURCE` (a context variable, so it follows the one
request) when placement chose this node and a peer stores the model, or when a forwarded request
names a source in ``x-llmman-source``; :func:`copy_from_peer` is what the gateway then calls before
falling back to the model's own registry.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from dataclasses import dataclass

from llmman.refs import Reference
from llmman.registry.client import RegistryClient
from llmman.registry.puller import Puller
from llmman.settings_table import HostAddress
from llmman.store import StoredModel

log = logging.getLogger("llmman.cluster")


@dataclass(frozen=True)
class PullSource:
    """A peer to copy from and the key to present to it (empty = none)."""

    address: HostAddress
    api_key: str = ""


PULL_SOURCE: ContextVar[PullSource | None] = ContextVar("llmman_pull_source", default=None)


def copy_from_peer(puller: Puller, ref: Reference, source: PullSource) -> StoredModel:
    """Pull ``ref`` from ``source``'s ``/v2/`` into this node's store (blocking; run it in a thread).

    Raises:
        LlmmanError (RegistryError and kin): the peer does not have it or failed.
    """
    address = source.address
    client = RegistryClient(address.netloc, insecure=address.scheme == "http")
    if source.api_key:
        client.http.headers["Authorization"] = f"Bearer {source.api_key}"
    try:
        log.info("copying %s from peer %s", ref, address.netloc)
        return puller.pull_via(ref, client)
    finally:
        client.close()
