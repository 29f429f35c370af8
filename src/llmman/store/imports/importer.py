"""Importing what the recognisers found: blobs linked (:mod:`llmman.store.imports.adopt`), a manifest
written, the model named in the index like any other.

* An Ollama model keeps Ollama's config and layers by digest, in an OCI manifest: its weights and
  projector are linked, its small layers (params, system, messages, license, template) copied;
  llmman reads params/system/messages/license as it reads a derived model's
  (:func:`llmman.store.read_extras`).
* Any other GGUF becomes a CNCF ModelPack artifact, as ``llmman build`` writes one, minus the creation
  time (so a re-import writes the same bytes).

Every imported manifest carries ``ai.llmman.imported-from`` (the source's path), and so does each linked
layer (the file it holds). Re-importing is
idempotent: the same manifest under the same name changes nothing. A name already used by a model that
was not imported from the same source is left alone (skipped: import it under another ``--name``); one
imported from the same source whose files changed (an Ollama tag pulled again) is updated.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from llmman.errors import BadRequest, GGUFError, LlmmanError, StoreError
from llmman.gguf import merge_split, read_gguf
from llmman.refs import parse_reference
from llmman.store import mediatypes as mt
from llmman.store.catalog import Store
from llmman.store.imports.adopt import adopt
from llmman.store.imports.found import Found, Part

__all__ = ["Outcome", "State", "import_all", "import_found"]

State = Literal["imported", "updated", "unchanged", "would import", "present", "skipped", "failed"]


@dataclass(frozen=True)
class Outcome:
    """What happened to one found model: its name, source, state, how its weights are held (``hard
    link``, ``reflink``, ``reference``, ``stored``; several joined by ``+``), their bytes, and the
    reason (skipped, failed) or the notes (what is kept but not used)."""

    name: str
    source: Path
    state: State
    how: str = ""
    size: int = 0
    detail: str = ""


def _origin(manifest: dict[str, Any]) -> str | None:
    ann = manifest.get("annotations")
    value = ann.get(mt.IMPORTED_FROM) if isinstance(ann, dict) else None
    return value if isinstance(value, str) else None


def _copy(store: Store, part: Part) -> str:
    """A small layer copied into the store (verified against the digest its source names)."""
    if part.digest is not None and store.has_blob(part.digest, part.size, pin=True):
        return part.digest
    with part.path.open("rb") as f:
        return store.write_blob(f, part.digest, part.size)


def _modelpack(found: Found, name: str, layers: list[dict[str, Any]]) -> dict[str, Any]:
    shards = [p.path for p in found.parts if not p.mmproj]
    info = merge_split([read_gguf(p) for p in shards])
    config = {
        "descriptor": {"name": name},
        "config": {"format": "gguf", "architecture": info.architecture, "paramSize": info.parameter_size,
                   "quantization": info.quantization,
                   "capabilities": {"inputTypes": ["text", "image"] if any(p.mmproj for p in found.parts)
                                    else ["text"], "outputTypes": ["text"]}},
        "modelfs": {"type": "layers", "diffIds": [d["digest"] for d in layers]},
    }
    return config


def _manifest(store: Store, found: Found, name: str, written: list[str]) -> tuple[bytes, set[str]]:
    """Link or copy every part, write the config; returns the manifest bytes and how weights are held."""
    hows: set[str] = set()
    layers: list[dict[str, Any]] = []
    for part in found.parts:
        if part.link:
            digest, how = adopt(store.layout, part)
            hows.add(how)
        else:
            digest = _copy(store, part)
        written.append(digest)
        desc: dict[str, Any] = {"mediaType": part.media_type, "digest": digest, "size": part.size}
        ann = {mt.FILEPATH: part.filename, mt.TITLE: part.filename} if part.filename else {}
        if part.mmproj and part.filename:
            ann[mt.ROLE] = mt.ROLE_MMPROJ
        if part.link:
            ann[mt.IMPORTED_FROM] = str(part.path)  # the file an error names if it changes
        if ann:
            desc["annotations"] = ann
        layers.append(desc)
    if found.config is not None:
        digest = _copy(store, found.config)
        written.append(digest)
        config_desc = {"mediaType": found.config.media_type, "digest": digest, "size": found.config.size}
    else:
        config_bytes = json.dumps(_modelpack(found, name, layers), separators=(",", ":")).encode()
        digest = store.write_blob([config_bytes])
        written.append(digest)
        config_desc = {"mediaType": mt.MODEL_CONFIG, "digest": digest, "size": len(config_bytes)}
    manifest: dict[str, Any] = {"schemaVersion": 2, "mediaType": mt.OCI_MANIFEST}
    if found.config is None:
        manifest["artifactType"] = mt.MODEL_ARTIFACT
    manifest.update(config=config_desc, layers=layers, annotations={mt.IMPORTED_FROM: str(found.source)})
    return json.dumps(manifest, separators=(",", ":")).encode(), hows


def _holds(store: Store, digest: str, path: Path) -> bool:
    """True when the blob ``digest`` is ``path`` itself and verified since it last changed."""
    try:
        return os.path.samefile(store.blob_path(digest), path) and store.layout.is_verified(digest)
    except (OSError, StoreError):
        return False


def _known(store: Store, found: Found, layers: list[dict[str, Any]]) -> Found:
    """``found`` with the digest of each file the store already links, unchanged since it was hashed
    (the same inode, or the target of a reference, whose verification record still matches): a re-import
    (every daemon start, with ``store.scan_dirs``) hashes only what changed."""
    digests = [str(d.get("digest")) for d in layers]
    parts = []
    for part in found.parts:
        if part.digest is None and part.link:
            same = next((d for d in digests if _holds(store, d, part.path)), None)
            part = replace(part, digest=same) if same is not None else part
        parts.append(part)
    return replace(found, parts=tuple(parts))


def import_found(store: Store, found: Found, *, name: str | None = None, dry_run: bool = False) -> Outcome:
    """Import one found model (rules in the module docstring) as ``name`` (default its own). Raises
    InvalidReference for a bad ``name``; every other failure is the outcome's ``failed`` state."""
    size = sum(p.size for p in found.parts)
    if found.problem:
        return Outcome(found.name, found.source, "skipped", detail=found.problem)
    ref = parse_reference(name or found.name)
    shown = str(ref)
    notes = "; ".join(found.notes)
    existing = store.find(ref)
    if existing is not None and _origin(existing.manifest) != str(found.source):
        return Outcome(shown, found.source, "skipped", detail="a model of that name is already in the store "
                                                               "(not imported from here): pass --name")
    if dry_run:  # nothing hashed or linked: an earlier import from here is only named as such
        if existing is not None:
            return Outcome(shown, found.source, "present", size=size,
                           detail="imported from here before (run without -n to pick up a change)")
        return Outcome(shown, found.source, "would import", size=size, detail=notes)
    if existing is not None:
        found = _known(store, found, existing.layers)
    written: list[str] = []
    try:
        data, hows = _manifest(store, found, shown, written)
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        how = " + ".join(sorted(hows))
        if existing is not None and existing.digest == digest and not store.missing_blobs(existing):
            return Outcome(shown, found.source, "unchanged", how, size, notes)
        store.put_manifest(ref, data, mt.OCI_MANIFEST)
    except (StoreError, GGUFError, OSError) as exc:
        store.layout.unpin(written)
        with contextlib.suppress(Exception):
            store.gc()  # the blobs linked for it, unless another model uses them
        reason = exc.message if isinstance(exc, LlmmanError) else f"{exc.strerror or exc}"
        return Outcome(shown, found.source, "failed", detail=reason)
    finally:
        store.layout.unpin(written)
    return Outcome(shown, found.source, "updated" if existing is not None else "imported", how, size, notes)


def import_all(store: Store, found: Sequence[Found], *, name: str | None = None, dry_run: bool = False,
               on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Import every found model in turn; ``name`` only when exactly one can be imported (BadRequest
    otherwise, before anything is written). ``on_outcome`` gets each result as it comes."""
    if name is not None:
        usable = [f for f in found if not f.problem]
        if len(usable) != 1:
            raise BadRequest(f"--name names one model, and the sources hold {len(usable)} that can be "
                             "imported")
    out = []
    for item in found:
        outcome = import_found(store, item, name=name if not item.problem else None, dry_run=dry_run)
        out.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
    return out
