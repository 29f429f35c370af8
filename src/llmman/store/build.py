"""Packaging local GGUF files as a CNCF ModelPack artifact (``llmman build``).

Input: one GGUF file, or a folder holding one model — a single GGUF or llama.cpp split shards
``<prefix>-0000k-of-0000n.gguf`` — plus at most one vision projector (``mmproj*.gguf`` or a GGUF whose
``general.architecture`` is ``clip``) and optional ``LICENSE*``/``README*``/``NOTICE*`` docs; other files are
ignored. Output: raw (untarred) layers, a ModelPack config and an OCI manifest with
``artifactType: application/vnd.cncf.model.manifest.v1+json`` (modelpack/model-spec/docs/spec.md).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmman.errors import BadRequest, GGUFError
from llmman.gguf import GGUFInfo, merge_split, read_gguf
from llmman.store import mediatypes as mt
from llmman.store.layout import CHUNK, Layout

if TYPE_CHECKING:
    from llmman.refs import Reference

SPLIT_NAME = re.compile(r"(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)
_DOC_PREFIXES = ("license", "licence", "readme", "notice", "copying")


@dataclass(frozen=True)
class BuildPlan:
    """The files of one model: weight shards in order (one for an unsplit model), projector, docs."""

    shards: tuple[Path, ...]
    mmproj: Path | None
    docs: tuple[Path, ...]
    info: GGUFInfo


def _read(path: Path) -> GGUFInfo:
    try:
        return read_gguf(path)
    except GGUFError as exc:
        raise BadRequest(f"{path}: {exc.message}") from exc


def plan_build(path: Path) -> BuildPlan:
    """Choose the files to package from ``path`` (a GGUF file or a folder; rules in the module docstring).

    Raises BadRequest: the path does not exist, holds no GGUF, a file is not a GGUF, several models,
    several projectors, shards with a gap or a ``split.count`` that disagrees, or a lone shard.
    """
    if path.is_file():
        files, folder_mode = [path], False
    elif path.is_dir():
        files, folder_mode = sorted(p for p in path.iterdir() if p.is_file()), True
    else:
        raise BadRequest(f"{path}: no such file or directory")
    ggufs = [p for p in files if p.name.lower().endswith(".gguf")]
    if not folder_mode and not ggufs:
        ggufs = files  # a single file given explicitly must be a GGUF whatever its name
    if not ggufs:
        raise BadRequest(f"no GGUF file found in {path}")
    infos = {p: _read(p) for p in ggufs}
    projectors = [p for p in ggufs if p.name.lower().startswith("mmproj") or infos[p].architecture == "clip"]
    models = [p for p in ggufs if p not in projectors]
    if len(projectors) > 1:
        raise BadRequest(f"more than one vision projector in {path}: {', '.join(p.name for p in projectors)}")
    if not models:
        raise BadRequest(f"no model GGUF in {path} (only a vision projector)")
    shards = _order_shards(models, path)
    first = infos[shards[0]]
    if first.split_count != len(shards):
        raise BadRequest(f"{shards[0].name} is part of a {first.split_count}-file split model, "
                         f"but {len(shards)} file(s) were found; pass the folder holding every shard")
    docs = tuple(p for p in files if folder_mode and p.name.lower().startswith(_DOC_PREFIXES))
    info = merge_split([infos[p] for p in shards])
    return BuildPlan(tuple(shards), projectors[0] if projectors else None, docs, info)


def _order_shards(models: list[Path], where: Path) -> list[Path]:
    matches = {p: SPLIT_NAME.fullmatch(p.name) for p in models}
    if len(models) == 1 and matches[models[0]] is None:
        return models
    if any(m is None for m in matches.values()):
        raise BadRequest(f"more than one model in {where}: {', '.join(p.name for p in models)}")
    keys = {(m["prefix"], int(m["count"])) for m in matches.values() if m is not None}
    if len(keys) > 1:
        raise BadRequest(f"more than one split model in {where}: {', '.join(p.name for p in models)}")
    count = keys.pop()[1]
    by_no = {int(m["no"]): p for p, m in matches.items() if m is not None}
    missing = [f"{k:05d}" for k in range(1, count + 1) if k not in by_no]
    if missing or len(by_no) != count:
        gap = ", ".join(missing)
        raise BadRequest(f"split GGUF in {where} has a gap: missing shard(s) {gap} of {count:05d}")
    return [by_no[k] for k in range(1, count + 1)]


def hash_file(path: Path) -> tuple[str, int]:
    """``(sha256:<hex>, size in bytes)`` of a file, read in 1 MiB chunks."""
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            n += len(chunk)
    return f"sha256:{h.hexdigest()}", n


def add_file(layout: Layout, path: Path, written: list[str] | None = None) -> tuple[str, int]:
    """Put a file's bytes in the store unless a blob with its digest is already there (hash first, then
    copy while hashing again, verified). Returns ``(digest, size)``; the blob is pinned against gc and its
    digest appended to ``written``."""
    digest, size = hash_file(path)
    if written is not None:
        written.append(digest)
    if not layout.has_blob(digest, size, pin=True):
        with open(path, "rb") as f:
            layout.write_blob(f, digest, size)
    return digest, size


def _layer(media: str, digest: str, size: int, name: str, role: str | None = None) -> dict[str, Any]:
    ann = {mt.FILEPATH: name, mt.TITLE: name}
    if role:
        ann[mt.ROLE] = role
    return {"mediaType": media, "digest": digest, "size": size, "annotations": ann}


def build_manifest(layout: Layout, ref: Reference, plan: BuildPlan,
                   labels: Mapping[str, str] | None = None, now: float | None = None,
                   written: list[str] | None = None) -> bytes:
    """Copy the plan's files into blobs and write the ModelPack config blob; returns the manifest bytes
    (not yet in the index: the caller puts it under the store lock). ``labels`` become manifest
    annotations; ``now`` (unix seconds) stamps ``descriptor.createdAt``; the digests of pinned blobs are
    appended to ``written`` as they are added (so a caller can unpin them after a failure)."""
    layers = []
    for shard in plan.shards:
        digest, size = add_file(layout, shard, written)
        layers.append(_layer(mt.MODEL_WEIGHT_RAW, digest, size, shard.name))
    if plan.mmproj is not None:
        digest, size = add_file(layout, plan.mmproj, written)
        layers.append(_layer(mt.MODEL_WEIGHT_RAW, digest, size, plan.mmproj.name, mt.ROLE_MMPROJ))
    for doc in plan.docs:
        digest, size = add_file(layout, doc, written)
        layers.append(_layer(mt.MODEL_DOC_RAW, digest, size, doc.name))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    inputs = ["text", "image"] if plan.mmproj is not None else ["text"]
    config = {
        "descriptor": {"createdAt": created, "name": str(ref)},
        "config": {
            "format": "gguf", "architecture": plan.info.architecture, "paramSize": plan.info.parameter_size,
            "quantization": plan.info.quantization,
            "capabilities": {"inputTypes": inputs, "outputTypes": ["text"]},
        },
        "modelfs": {"type": "layers", "diffIds": [d["digest"] for d in layers]},
    }
    config_bytes = json.dumps(config, separators=(",", ":")).encode()
    config_digest = f"sha256:{hashlib.sha256(config_bytes).hexdigest()}"
    if written is not None:
        written.append(config_digest)
    layout.write_blob([config_bytes], config_digest, len(config_bytes))
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": mt.OCI_MANIFEST,
        "artifactType": mt.MODEL_ARTIFACT,
        "config": {"mediaType": mt.MODEL_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": layers,
    }
    if labels:
        manifest["annotations"] = dict(labels)
    return json.dumps(manifest, separators=(",", ":")).encode()
