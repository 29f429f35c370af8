"""Reading pulled manifests: media types, image-index selection, the blobs a manifest needs.

Sources: OCI image-spec 1.1 (manifest.md, image-index.md, descriptor.md), Docker image manifest v2
schema 2 and manifest list, Docker Model Runner artifacts (``application/vnd.docker.ai.*``) and CNCF
ModelPack (``artifactType`` ``application/vnd.cncf.model.manifest.v1+json``), and Ollama's registry format
(a Docker v2 manifest whose config is ``application/vnd.docker.container.image.v1+json`` and whose layers
are ``application/vnd.ollama.image.*``: stored as is, served by :func:`llmman.store.layer_role`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from llmman.registry.client import RegistryError
from llmman.store import mediatypes as mt
from llmman.store.layout import digest_hex

_MODEL_PREFIXES = ("application/vnd.docker.ai.", "application/vnd.cncf.model.", mt.OLLAMA_PREFIX)


@dataclass(frozen=True)
class Blob:
    """A descriptor to fetch: digest, size and media type."""

    digest: str
    size: int
    media_type: str


def sha256_digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def parse(data: bytes, media_type: str) -> tuple[dict[str, Any], str]:
    """Decode a manifest; returns it and its media type (the body's ``mediaType`` wins over a missing
    or generic ``Content-Type``). Raises RegistryError for anything that is not a JSON object."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise RegistryError(f"the registry sent a manifest that is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise RegistryError("the registry sent a manifest that is not a JSON object")
    body_type = doc.get("mediaType")
    if isinstance(body_type, str) and body_type:
        media_type = body_type
    elif media_type not in mt.MANIFEST_TYPES | mt.INDEX_TYPES:
        media_type = mt.OCI_INDEX if "manifests" in doc else mt.OCI_MANIFEST
    return doc, media_type


def is_index(media_type: str) -> bool:
    return media_type in mt.INDEX_TYPES


def choose(index: dict[str, Any], what: str) -> dict[str, Any]:
    """The entry of an image index to pull: the only one; else the model artifacts among them (by
    ``artifactType`` or media type), which must then be exactly one; else linux/amd64.
    Raises RegistryError naming what was offered."""
    entries = [e for e in index.get("manifests") or []
               if isinstance(e, dict) and isinstance(e.get("digest"), str)]
    if len(entries) == 1:
        return entries[0]
    models = [e for e in entries if str(e.get("artifactType") or "").startswith(_MODEL_PREFIXES)]
    if len(models) == 1:
        return models[0]
    amd64 = [e for e in entries if isinstance(e.get("platform"), dict)
             and e["platform"].get("os") == "linux" and e["platform"].get("architecture") == "amd64"]
    if len(amd64) == 1:
        return amd64[0]
    offered = ", ".join(str(e.get("artifactType") or e.get("platform") or e.get("mediaType"))
                        for e in entries)
    raise RegistryError(f"{what} is an image index with {len(entries)} entries and none is clearly "
                        f"the model to pull ({offered or 'empty'})")


def blobs(manifest: dict[str, Any]) -> list[Blob]:
    """Config then layers, each checked: a ``sha256:<64 hex>`` digest and a non-negative int size.
    Raises RegistryError for a manifest without layers or with a malformed descriptor."""
    out: list[Blob] = []
    descs = [manifest.get("config")] if isinstance(manifest.get("config"), dict) else []
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not layers:
        raise RegistryError("the manifest has no layers")
    for desc in [*descs, *layers]:
        if not isinstance(desc, dict):
            raise RegistryError("the manifest has a malformed descriptor")
        digest, size = desc.get("digest"), desc.get("size")
        if not isinstance(digest, str) or not isinstance(size, int) or size < 0:
            raise RegistryError(f"the manifest has a malformed descriptor: {desc}")
        try:
            digest_hex(digest)
        except Exception as exc:
            raise RegistryError(f"unsupported digest {digest!r} (only sha256)") from exc
        out.append(Blob(digest, size, str(desc.get("mediaType") or "")))
    return out
