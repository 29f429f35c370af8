"""Resolving a stored model to the files llama-server opens: every shard, the projector, no copies.

A single-file GGUF is served straight from its blob (``blobs/sha256/<hex>``): no copy, no cache. llama.cpp
finds the other shards of a split model by file name (``<prefix>-0000k-of-0000n.gguf`` next to the first),
so for a split model a folder ``<cache>/<manifest hex>/`` of symlinks to the blobs is materialised, named
by each layer's ``org.cncf.model.filepath`` when those names form a complete split set, else
``model-0000k-of-0000n.gguf`` in manifest order. The vision projector is passed as its blob path.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path

from llmman.errors import StoreError
from llmman.store import mediatypes as mt
from llmman.store.build import SPLIT_NAME
from llmman.store.layout import Layout
from llmman.store.model import ModelFiles, StoredModel, layer_filename, layer_role


def gguf_blobs(layout: Layout, model: StoredModel) -> tuple[list[tuple[str, Path]], Path | None]:
    """``([(file name, blob path) for each weight shard, in order], mmproj blob path or None)``.

    Raises StoreError when the manifest has no GGUF weight layer or a blob is missing."""
    shards: list[tuple[str, Path]] = []
    mmproj: Path | None = None
    for desc in model.layers:
        role = layer_role(desc)
        if role not in ("model", "mmproj"):
            continue
        digest = str(desc.get("digest"))
        path = layout.blob_path(digest)
        if not path.is_file():
            origin = imported_origin(layout, model, digest)
            if origin is not None:
                raise import_error(model, digest, origin, changed=False, linked=path.is_symlink())
            raise StoreError(f"blob {digest} of {model.reference} is missing; pull the model again")
        if role == "mmproj":
            mmproj = mmproj or path
        else:
            shards.append((os.path.basename(layer_filename(desc)), path))
    if not shards:
        raise StoreError(f"no servable GGUF layer in {model.reference}")
    return _name_shards(shards), mmproj


def imported_origin(layout: Layout, model: StoredModel, digest: str) -> str | None:
    """Where ``model``'s blob ``digest`` was imported from (``llmman import``), or None for a blob the
    store owns: a reference (the blob is a symlink) names its target; a hard link, the file its layer's
    ``ai.llmman.imported-from`` annotation names, else the manifest's."""
    with contextlib.suppress(OSError, StoreError):
        return os.readlink(layout.blob_path(digest))
    layers = [d.get("annotations") for d in model.layers if d.get("digest") == digest]
    for ann in [*layers, model.manifest.get("annotations")]:
        origin = ann.get(mt.IMPORTED_FROM) if isinstance(ann, dict) else None
        if isinstance(origin, str) and origin:
            return origin
    return None


def import_error(model: StoredModel, digest: str, origin: str, *, changed: bool, linked: bool) -> StoreError:
    """The 503 for an imported model whose source ``origin`` changed (``changed``: its bytes no longer
    match ``digest``) or is gone (``linked``: the store's reference dangles; else the store's link was
    removed), so llmman does not serve it."""
    what = ("has changed: its bytes no longer match" if changed else
            "is gone (moved or deleted): it was" if linked else
            "is no longer in the store (it changed, or its link was removed): it was")
    return StoreError(f"{origin}, which {model.reference} was imported from, {what} blob {digest}; llmman "
                      "does not use it: run `llmman import` on it again", status=503,
                      code="import_changed" if changed else "import_missing")


def gguf_digests(model: StoredModel) -> list[str]:
    """The digests of the model's weight shards and projector, in manifest order."""
    return [str(d.get("digest")) for d in model.layers if layer_role(d) in ("model", "mmproj")]


def _name_shards(shards: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    if len(shards) == 1:
        return shards
    n = len(shards)
    found = {}
    for name, path in shards:
        m = SPLIT_NAME.fullmatch(name)
        if m is None or int(m["count"]) != n:
            break
        found[(m["prefix"], int(m["no"]))] = (name, path)
    prefixes = {prefix for prefix, _ in found}
    if len(found) == n and len(prefixes) == 1 and {no for _, no in found} == set(range(1, n + 1)):
        prefix = prefixes.pop()
        return [found[(prefix, k)] for k in range(1, n + 1)]
    return [(f"model-{k + 1:05d}-of-{n:05d}.gguf", path) for k, (_, path) in enumerate(shards)]


def resolve_files(layout: Layout, cache_dir: Path, model: StoredModel) -> ModelFiles:
    """The paths for llama-server's ``-m`` and ``--mmproj`` (see module docstring).

    Raises StoreError when the model has no GGUF weights, a blob is missing, or the symlink folder
    cannot be created."""
    shards, mmproj = gguf_blobs(layout, model)
    if len(shards) == 1:
        path = shards[0][1]
        return ModelFiles(model=path, shards=(path,), mmproj=mmproj)
    folder = cache_dir / model.hex
    links = [(name, blob.resolve()) for name, blob in shards]
    _materialise(folder, links)
    paths = tuple(folder / name for name, _ in links)
    return ModelFiles(model=paths[0], shards=paths, mmproj=mmproj)


def _valid(folder: Path, links: list[tuple[str, Path]]) -> bool:
    try:
        return all(os.readlink(folder / name) == str(target) for name, target in links)
    except OSError:
        return False


def _materialise(folder: Path, links: list[tuple[str, Path]]) -> None:
    """Create ``folder`` holding exactly ``links`` (name -> absolute target), atomically: built under a
    temp name then renamed; a wrong or partial folder is replaced; a concurrent creator wins harmlessly."""
    if _valid(folder, links):
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.{secrets.token_hex(4)}.tmp"
    try:
        tmp.mkdir()
        for name, target in links:
            os.symlink(target, tmp / name)
        if folder.is_symlink() or folder.is_file():
            folder.unlink()
        elif folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rename(tmp, folder)
    except OSError as exc:
        raise StoreError(f"cannot create {folder}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not _valid(folder, links):
        raise StoreError(f"cannot create a valid shard folder {folder}")
