"""Derived models: a base model's weights plus a system prompt, default options, seed messages, licenses.

``POST /api/create {"model", "from", "system"?, "parameters"?, "messages"?, "license"?}`` (Ollama's
``ollama create`` with a Modelfile ``FROM``/``SYSTEM``/``PARAMETER``/``MESSAGE``/``LICENSE``) writes a
new manifest that REUSES the base manifest's config and layers by digest (no copy of the GGUF) and adds
small layers of Ollama's media types (:data:`llmman.store.mediatypes.DERIVED_TYPES`):

* ``application/vnd.ollama.image.system``: the system prompt, UTF-8 text;
* ``application/vnd.ollama.image.params``: a JSON object of Ollama options (``{"temperature": 0.2,
  "stop": ["<|im_end|>"]}``);
* ``application/vnd.ollama.image.messages``: a JSON array of ``{"role", "content"}``;
* ``application/vnd.ollama.image.license``: one layer per license text.

Inheritance follows Ollama (server/create.go): deriving from a model that has such layers keeps them,
except that a new ``system``/``messages``/``license`` replaces the old one and new ``parameters`` are
merged key by key over the old ones (the new value wins). The base model's config blob is reused as is.
Blobs go through :meth:`Layout.write_blob` (atomic, digest-verified, pinned until the manifest is put).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmman.errors import BadRequest, StoreError
from llmman.store import mediatypes as mt
from llmman.store.model import layer_role

if TYPE_CHECKING:
    from llmman.refs import Reference
    from llmman.store.catalog import Store
    from llmman.store.layout import Layout
    from llmman.store.model import StoredModel

__all__ = ["ModelExtras", "derive_model", "read_extras"]

_LIMIT = 4 << 20  # bytes: the largest system/params/messages/license layer read back


@dataclass(frozen=True)
class ModelExtras:
    """What a derived model adds to its weights (all empty for a plain model).

    ``system``: the system prompt ("" when none); ``parameters``: Ollama options; ``messages``: seed
    conversation of ``{"role", "content"}``; ``license``: license texts, in layer order."""

    system: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    license: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """True when the model carries none of these layers' content."""
        return not (self.system or self.parameters or self.messages or self.license)


def _json(layout: Layout, desc: dict[str, Any], want: type) -> Any:
    what = f"layer {desc.get('digest')} ({desc.get('mediaType')})"
    try:
        value = json.loads(layout.read_blob(str(desc.get("digest")), limit=_LIMIT))
    except ValueError as exc:
        raise StoreError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(value, want):
        raise StoreError(f"{what} is not a JSON {want.__name__}")
    return value


def read_extras(layout: Layout, model: StoredModel) -> ModelExtras:
    """The system prompt, parameters, messages and licenses of ``model``'s Ollama layers. A model
    without such layers costs no file read. Raises StoreError for a missing or malformed layer blob."""
    system, parameters, messages, licenses = "", {}, [], []
    for desc in model.layers:
        media = desc.get("mediaType")
        if media not in mt.DERIVED_TYPES:
            continue
        if media == mt.OLLAMA_PARAMS:
            parameters = _json(layout, desc, dict)
        elif media == mt.OLLAMA_MESSAGES:
            messages = [m for m in _json(layout, desc, list) if isinstance(m, dict)]
        else:
            text = layout.read_blob(str(desc.get("digest")), limit=_LIMIT).decode("utf-8", "replace")
            if media == mt.OLLAMA_SYSTEM:
                system = text
            else:
                licenses.append(text)
    return ModelExtras(system, parameters, messages, licenses)


def _blob_layer(layout: Layout, media: str, data: bytes, written: list[str]) -> dict[str, Any]:
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    written.append(digest)
    layout.write_blob([data], digest, len(data))
    return {"mediaType": media, "digest": digest, "size": len(data)}


def derive_model(store: Store, source: Reference, target: Reference, *, system: str | None = None,
                 parameters: Mapping[str, Any] | None = None,
                 messages: Sequence[Mapping[str, Any]] | None = None,
                 license: Sequence[str] | None = None) -> StoredModel:
    """Store ``target`` as ``source`` plus the given fields (None: inherit; see the module docstring).

    ``source`` may equal ``target`` (the entry is replaced). Raises ModelNotFound(str(source)),
    BadRequest when ``source`` has no GGUF weight layer, StoreError for write failures (the index is then
    unchanged)."""
    base = store.get(source)
    if not any(layer_role(d) == "model" for d in base.layers):
        raise BadRequest(f"{source} has no GGUF weight layer to derive a model from")
    extras = read_extras(store.layout, base)
    replace = {mt.OLLAMA_PARAMS} if parameters else set()
    if system is not None:
        replace.add(mt.OLLAMA_SYSTEM)
    if messages is not None:
        replace.add(mt.OLLAMA_MESSAGES)
    if license is not None:
        replace.add(mt.OLLAMA_LICENSE)
    layers = [dict(d) for d in base.layers if d.get("mediaType") not in replace]
    written: list[str] = []
    try:
        if parameters:
            merged = {**extras.parameters, **parameters}
            data = json.dumps(merged, separators=(",", ":"), ensure_ascii=False).encode()
            layers.append(_blob_layer(store.layout, mt.OLLAMA_PARAMS, data, written))
        if system:
            layers.append(_blob_layer(store.layout, mt.OLLAMA_SYSTEM, system.encode(), written))
        if messages:
            data = json.dumps([dict(m) for m in messages], separators=(",", ":"), ensure_ascii=False).encode()
            layers.append(_blob_layer(store.layout, mt.OLLAMA_MESSAGES, data, written))
        for text in license or ():
            layers.append(_blob_layer(store.layout, mt.OLLAMA_LICENSE, text.encode(), written))
        manifest = {k: v for k, v in base.manifest.items() if k != "layers"}
        manifest["layers"] = layers
        media = str(manifest.get("mediaType") or mt.OCI_MANIFEST)
        return store.put_manifest(target, json.dumps(manifest, separators=(",", ":")).encode(), media)
    except BaseException:
        store.layout.unpin(written)
        raise
