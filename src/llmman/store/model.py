"""What a stored model is: an index entry with its manifest, and the roles of its layers.

Layer roles understood when reading (Docker Model Runner's ``model-distribution``, CNCF ``model-spec``):

* Docker Model Runner artifacts: ``application/vnd.docker.ai.gguf.v3`` (weights, one layer per shard),
  ``application/vnd.docker.ai.mmproj`` (vision projector), ``application/vnd.docker.ai.license`` (doc).
* Ollama (its store, and its registry format): ``application/vnd.ollama.image.model`` (weights, one
  GGUF), ``application/vnd.ollama.image.projector`` (vision projector).
* CNCF ModelPack: ``application/vnd.cncf.model.weight.v1.raw`` layers whose file name ends in ``.gguf``
  are weights, unless annotated ``ai.llmman.role: mmproj`` or named ``mmproj*`` (the projector);
  ``application/vnd.cncf.model.doc.*`` are docs. Tarred or compressed weight layers are not servable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from llmman.store import mediatypes as mt

Role = Literal["model", "mmproj", "doc", "other"]


@dataclass(frozen=True)
class StoredModel:
    """One entry of ``index.json``.

    Attributes:
        reference: the full reference string from ``org.opencontainers.image.ref.name``.
        digest: ``sha256:<hex>`` of the manifest blob.
        size: bytes, the sum of the layer sizes (config excluded, as Ollama reports it).
        modified_at: unix seconds, the manifest blob's mtime (refreshed when the entry is (re)written).
        manifest: the parsed manifest JSON.
    """

    reference: str
    digest: str
    size: int
    modified_at: float
    manifest: dict[str, Any] = field(compare=False, hash=False)

    @property
    def hex(self) -> str:
        """The 64 hex digits of the manifest digest."""
        return self.digest.split(":", 1)[1]

    @property
    def short_id(self) -> str:
        """The first 12 hex digits of the manifest digest (the ``ID`` column of ``llmman list``)."""
        return self.hex[:12]

    @property
    def layers(self) -> list[dict[str, Any]]:
        """The manifest's layer descriptors (empty for an index or a malformed manifest)."""
        layers = self.manifest.get("layers")
        return [d for d in layers if isinstance(d, dict)] if isinstance(layers, list) else []

    @property
    def format(self) -> str:
        """``gguf`` when any layer is a GGUF, else ``safetensors`` when any is, else ``unknown``."""
        names = [layer_filename(d).lower() for d in self.layers]
        if any(layer_role(d) in ("model", "mmproj") for d in self.layers):
            return "gguf"
        return "safetensors" if any(n.endswith(".safetensors") for n in names) else "unknown"


@dataclass(frozen=True)
class ModelFiles:
    """The files to hand llama-server: ``model`` for ``-m`` (the first shard), every shard in order, and the
    vision projector for ``--mmproj`` (None without one). Paths point into the store; never copies."""

    model: Path
    shards: tuple[Path, ...]
    mmproj: Path | None = None


def layer_filename(desc: dict[str, Any]) -> str:
    """The layer's file name: ``org.cncf.model.filepath``, else ``org.opencontainers.image.title``,
    else ""."""
    ann = desc.get("annotations")
    if isinstance(ann, dict):
        for key in (mt.FILEPATH, mt.TITLE):
            value = ann.get(key)
            if isinstance(value, str) and value:
                return value
    return ""


def layer_role(desc: dict[str, Any]) -> Role:
    """Classify a layer descriptor as ``model`` (GGUF weights/shard), ``mmproj``, ``doc`` or ``other``."""
    media = desc.get("mediaType")
    if media in (mt.DOCKER_AI_GGUF, mt.OLLAMA_MODEL):
        return "model"
    if media in (mt.DOCKER_AI_MMPROJ, mt.OLLAMA_PROJECTOR):
        return "mmproj"
    if media == mt.DOCKER_AI_LICENSE or (isinstance(media, str) and media.startswith(mt.MODEL_DOC_PREFIX)):
        return "doc"
    name = layer_filename(desc)
    base = name.rsplit("/", 1)[-1].lower()
    if media == mt.MODEL_WEIGHT_RAW and base.endswith(".gguf"):
        ann = desc.get("annotations")
        role = ann.get(mt.ROLE) if isinstance(ann, dict) else None
        return "mmproj" if role == mt.ROLE_MMPROJ or base.startswith("mmproj") else "model"
    return "other"


def descriptor_digests(manifest: dict[str, Any]) -> list[str]:
    """Digests a manifest or index points at: ``config``, ``layers[]``, ``manifests[]`` (in that order)."""
    out: list[str] = []
    config = manifest.get("config")
    if isinstance(config, dict) and isinstance(config.get("digest"), str):
        out.append(config["digest"])
    for key in ("layers", "manifests"):
        items = manifest.get(key)
        if isinstance(items, list):
            out.extend(d["digest"] for d in items if isinstance(d, dict) and isinstance(d.get("digest"), str))
    return out
