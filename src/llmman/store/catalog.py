"""The model store: named manifests in an OCI image layout (OCI image-spec ``image-layout.md``).

``index.json`` lists one manifest descriptor per reference, annotated
``org.opencontainers.image.ref.name`` = the full reference (``docker.io/ai/smollm2:135m``). Every change of
the index happens under the store lock as read-modify-write followed by an atomic rename; blobs are
written and verified before any manifest that needs them enters the index.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from llmman.errors import ModelNotFound, StoreError
from llmman.gguf import GGUFInfo, merge_split, read_gguf, with_capability
from llmman.store import mediatypes as mt
from llmman.store.build import build_manifest, plan_build
from llmman.store.files import gguf_blobs, gguf_digests, import_error, imported_origin, resolve_files
from llmman.store.layout import Check, Layout
from llmman.store.listing import Listing, StoreIndex, entry_name, names, read_model
from llmman.store.model import ModelFiles, StoredModel, descriptor_digests

if TYPE_CHECKING:
    from llmman.refs import Reference

log = logging.getLogger(__name__)
_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class BlobCheck:
    """One blob's result in :meth:`Store.check`: its digest, declared size (-1 for a top manifest),
    ``ok``/``corrupt`` (removed)/``missing``, and the stored names that use it."""

    digest: str
    size: int
    state: Check
    models: builtins.list[str]


def stored_name(ref: Reference) -> str:
    """The ``ref.name`` annotation for a reference: ``registry/repository:tag`` (never the digest)."""
    return f"{ref.registry}/{ref.repository}:{ref.tag}"


def _matches(entry: dict[str, Any], ref: Reference) -> bool:
    named = entry_name(entry)
    return named is not None and names(ref, *named)


class Store:
    """An OCI image-layout model store at ``root`` (created lazily by the first write).

    ``cache_dir`` (default ``<root>/../cache``) holds the symlink folders of split models. What it lists is
    kept in memory (:class:`llmman.store.listing.StoreIndex`) and read again when the store changed, by
    this process or another."""

    def __init__(self, root: Path, cache_dir: Path | None = None) -> None:
        self.root = Path(root)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else self.root.parent / "cache"
        self.layout = Layout(self.root)
        self.index = StoreIndex(self.layout, self.info)

    # -- reading ---------------------------------------------------------------------------------
    def _model(self, entry: dict[str, Any]) -> StoredModel | None:
        return read_model(self.layout, entry)

    def list(self) -> builtins.list[StoredModel]:
        """Every named model, in index order. Entries whose manifest blob is unreadable are skipped."""
        return builtins.list(self.index.listing().models)

    def listing(self, *, details: bool = False) -> Listing:
        """The current :class:`Listing` (with ``details``: every model's GGUF header too). Reads from disk
        when the store changed since it was last read: call it off the event loop."""
        return self.index.listing(details=details)

    def listing_if_current(self, *, details: bool = False) -> Listing | None:
        """The kept :class:`Listing` when it is provably current (two ``stat`` calls), else None: what a
        route may call on the event loop before it sends :meth:`listing` to a thread."""
        return self.index.current(details=details)

    def find(self, ref: Reference) -> StoredModel | None:
        """The model stored under ``ref`` (full name compared case-insensitively; a digest-pinned
        reference matches an entry of the same repository with that manifest digest), or None. From the
        kept listing (read first when the store changed a while ago), else, within ``listing.RACY_S`` of a
        write, from ``index.json`` and the one manifest."""
        kept = self.index.for_lookup()
        if kept is not None:
            return kept.find(ref)
        for entry in self.layout.read_index()["manifests"]:
            if isinstance(entry, dict) and _matches(entry, ref):
                return self._model(entry)
        return None

    def get(self, ref: Reference) -> StoredModel:
        """Like :meth:`find`; raises ModelNotFound(str(ref)) (404 ``model '<name>' not found``)."""
        model = self.find(ref)
        if model is None:
            raise ModelNotFound(str(ref))
        return model

    def files(self, model: StoredModel, *, verify: bool = True) -> ModelFiles:
        """Paths for llama-server (see :mod:`llmman.store.files`). With ``verify`` (a load), every GGUF
        blob is checked first (:meth:`Layout.verify_blob`: a stat when it is unchanged since it was last
        hashed, else a full hash); a corrupt one is removed. Raises StoreError (503 for a corrupt
        blob)."""
        if verify:
            for digest in gguf_digests(model):
                origin = imported_origin(self.layout, model, digest)  # before a corrupt link is removed
                linked = self.layout.blob_path(digest).is_symlink()
                state = self.layout.verify_blob(digest)
                if state != "ok" and origin is not None:
                    raise import_error(model, digest, origin, changed=state == "corrupt", linked=linked)
                if state == "corrupt":
                    raise StoreError(
                        f"blob {digest} of {model.reference} was corrupt (its bytes no longer match its "
                        f"sha256) and has been removed; pull the model again or run `llmman verify "
                        f"--repair`", status=503, code="corrupt_blob")
        return resolve_files(self.layout, self.cache_dir, model)

    def info(self, model: StoredModel) -> GGUFInfo:
        """GGUF header of the model (all shards merged), with "vision" added when it has a projector.

        Raises StoreError (no GGUF layer, missing blob) or GGUFError (unreadable GGUF)."""
        shards, mmproj = gguf_blobs(self.layout, model)
        info = merge_split([read_gguf(path) for _, path in shards])
        return with_capability(info, "vision") if mmproj is not None else info

    # -- verification (``llmman verify``) -------------------------------------------------------------
    def entries(self, refs: Iterable[Reference] | None = None) -> builtins.list[tuple[str, str]]:
        """``(stored name, manifest digest)`` of every index entry, or of those ``refs`` name (each must
        match one: ModelNotFound otherwise). Entries whose manifest is unreadable are included."""
        found = []
        for e in self.layout.read_index()["manifests"]:
            ann = e.get("annotations") if isinstance(e, dict) else None
            name = ann.get(mt.REF_NAME) if isinstance(ann, dict) else None
            if isinstance(name, str) and isinstance(e.get("digest"), str):
                found.append((name, str(e["digest"])))
        if refs is None:
            return found
        out: builtins.list[tuple[str, str]] = []
        entries = {(n, d): {"digest": d, "annotations": {mt.REF_NAME: n}} for n, d in found}
        for ref in refs:
            hits = [key for key, entry in entries.items() if _matches(entry, ref)]
            if not hits:
                raise ModelNotFound(str(ref))
            out.extend(h for h in hits if h not in out)
        return out

    def missing_blobs(self, model: StoredModel) -> builtins.list[str]:
        """Digests ``model``'s manifest names (config, layers, nested manifests) that are not on disk
        with their declared size (a stat each, no hashing)."""
        return [str(d["digest"]) for key in ("config", "layers", "manifests")
                for d in _descriptors(model.manifest, key)
                if not self.layout.has_blob(str(d["digest"]), _size(d))]

    def check(self, refs: Iterable[Reference] | None = None,
              on_blob: Callable[[BlobCheck], None] | None = None, *, force: bool = True
              ) -> builtins.list[BlobCheck]:
        """Hash every blob the index entries (or those ``refs`` name) reach, manifests first: the fsck
        of ``llmman verify`` (``force=False``: only blobs changed since they were last verified). A
        corrupt blob is removed (:meth:`Layout.verify_blob`); a manifest that is missing or corrupt hides
        its layers (they are not reported). ``on_blob`` gets each result as it comes. Raises
        ModelNotFound for a ref that names nothing."""
        users: dict[str, builtins.list[str]] = {}
        sizes: dict[str, int] = {}
        results: dict[str, BlobCheck] = {}

        def visit(digest: str, size: int, name: str) -> None:
            users.setdefault(digest, [])
            if name not in users[digest]:
                users[digest].append(name)
            sizes.setdefault(digest, size)
            if digest in results:
                return
            try:
                state = self.layout.verify_blob(digest, force=force)
            except StoreError:
                state = "corrupt"  # not a sha256 digest: nothing can verify it
            results[digest] = BlobCheck(digest, sizes[digest], state, users[digest])
            if on_blob is not None:
                on_blob(results[digest])
            if state != "ok":
                return
            try:
                manifest = json.loads(self.layout.read_blob(digest))
            except (StoreError, ValueError):
                return
            if not isinstance(manifest, dict) or not any(k in manifest for k in ("layers", "manifests")):
                return  # a config or a layer
            for key in ("config", "layers", "manifests"):
                for child in _descriptors(manifest, key):
                    visit(str(child["digest"]), _size(child) or 0, name)

        for name, digest in self.entries(refs):
            visit(digest, -1, name)
        return builtins.list(results.values())

    # -- blobs (for pull/push) -----------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        """``<root>/blobs/sha256/<hex>``; StoreError for a digest that is not ``sha256:<64 hex>``."""
        return self.layout.blob_path(digest)

    def has_blob(self, digest: str, size: int | None = None, pin: bool = False) -> bool:
        """True when the blob is present (and ``size`` bytes when given). A pull that skips a present
        layer passes ``pin=True``: the blob is then protected from gc until a manifest using it is put."""
        return self.layout.has_blob(digest, size, pin=pin)

    def write_blob(self, stream: BinaryIO | Iterable[bytes], expected_digest: str | None = None,
                   expected_size: int | None = None) -> str:
        """Stream a blob in, verified; returns its digest. Raises StoreError on mismatch, leaving nothing."""
        return self.layout.write_blob(stream, expected_digest, expected_size)

    # -- writing ---------------------------------------------------------------------------------
    def _set_entry(self, name: str, desc: dict[str, Any]) -> builtins.list[str]:
        """Put ``desc`` under ``name`` in the index (replacing in place); returns replaced digests.
        Caller holds the lock."""
        index = self.layout.read_index()
        kept, replaced, placed = [], [], False
        for entry in index["manifests"]:
            ann = entry.get("annotations") if isinstance(entry, dict) else None
            other = ann.get(mt.REF_NAME) if isinstance(ann, dict) else None
            if isinstance(other, str) and other.lower() == name.lower():
                replaced.append(str(entry.get("digest")))
                if not placed:
                    kept.append(desc)
                    placed = True
                continue
            kept.append(entry)
        if not placed:
            kept.append(desc)
        index["manifests"] = kept
        self.layout.write_index(index)
        return replaced

    def put_manifest(self, ref: Reference, manifest_bytes: bytes, media_type: str) -> StoredModel:
        """Store a manifest (or index) blob and name it ``ref`` in the index, replacing any entry with
        that name. Every blob it references must already be present with the declared size.

        Raises StoreError: not JSON, a referenced blob missing or of the wrong size, or ``ref.digest``
        given and different from the manifest's digest."""
        try:
            manifest = json.loads(manifest_bytes)
        except ValueError as exc:
            raise StoreError(f"manifest for {ref} is not JSON: {exc}") from exc
        if not isinstance(manifest, dict):
            raise StoreError(f"manifest for {ref} is not a JSON object")
        digest = f"sha256:{hashlib.sha256(manifest_bytes).hexdigest()}"
        if ref.digest is not None and ref.digest != digest:
            raise StoreError(f"manifest digest {digest} does not match {ref.digest}")
        children = [d for key in ("config", "layers", "manifests") for d in _descriptors(manifest, key)]
        self.layout.write_blob([manifest_bytes], digest, len(manifest_bytes))
        desc: dict[str, Any] = {"mediaType": media_type, "digest": digest, "size": len(manifest_bytes)}
        if isinstance(manifest.get("artifactType"), str):
            desc["artifactType"] = manifest["artifactType"]
        name = stored_name(ref)
        desc["annotations"] = {mt.REF_NAME: name}
        try:
            with self.layout.lock():
                for child in children:
                    if not self.layout.has_blob(str(child.get("digest")), _size(child)):
                        raise StoreError(f"manifest for {ref} references missing blob {child.get('digest')}")
                blob = self.layout.blob_path(digest)
                os.utime(blob)  # modified_at; before the index changes, so a listing sees both at once
                self.layout.record_verified(digest)  # write_blob just verified it; utime changed its stat
                mtime = blob.stat().st_mtime
                replaced = self._set_entry(name, desc)
        except BaseException:
            self.layout.unpin([digest])
            raise
        self.layout.unpin([digest, *descriptor_digests(manifest)])
        if any(d != digest for d in replaced):
            self.gc()
        # Built from what was written, not read back: a concurrent put of the same name may already have
        # replaced this entry (the last write wins) and gc removed this manifest.
        size = sum(_size(d) or 0 for d in _descriptors(manifest, "layers"))
        return StoredModel(reference=name, digest=digest, size=size, modified_at=mtime, manifest=manifest)

    def build(self, ref: Reference, path: Path, labels: Mapping[str, str] | None = None) -> StoredModel:
        """Package a local GGUF file or model folder as a ModelPack artifact named ``ref`` (replacing any
        entry with that name). Raises BadRequest for unusable input (see :func:`plan_build`),
        StoreError for write failures; on failure the index is unchanged and new blobs are collected."""
        plan = plan_build(Path(path))
        written: builtins.list[str] = []
        try:
            manifest = build_manifest(self.layout, ref, plan, labels, written=written)
            return self.put_manifest(ref, manifest, mt.OCI_MANIFEST)
        except BaseException:
            self.layout.unpin(written)
            with contextlib.suppress(Exception):
                self.gc()
            raise

    def tag(self, source: Reference, target: Reference) -> StoredModel:
        """Name the manifest of ``source`` also ``target`` (replacing any entry named ``target``).
        Raises ModelNotFound(str(source))."""
        name = stored_name(target)
        with self.layout.lock():
            entry = next((e for e in self.layout.read_index()["manifests"]
                          if isinstance(e, dict) and _matches(e, source)), None)
            if entry is None:
                raise ModelNotFound(str(source))
            desc = {k: v for k, v in entry.items() if k != "annotations"}
            desc["annotations"] = {mt.REF_NAME: name}
            model = self._model(desc)  # read under the lock: a concurrent put may replace it right after
            if model is None:
                raise StoreError(f"manifest of {source} is unreadable")
            replaced = self._set_entry(name, desc)
        if any(d != desc["digest"] for d in replaced):
            self.gc()
        return model

    def remove(self, ref: Reference) -> builtins.list[str]:
        """Delete the entry named ``ref`` then collect garbage; returns the removed blob digests.
        Raises ModelNotFound(str(ref))."""
        with self.layout.lock():
            index = self.layout.read_index()
            kept = [e for e in index["manifests"] if not (isinstance(e, dict) and _matches(e, ref))]
            if len(kept) == len(index["manifests"]):
                raise ModelNotFound(str(ref))
            index["manifests"] = kept
            self.layout.write_index(index)
            return self.gc()

    def gc(self) -> builtins.list[str]:
        """Delete blobs that no indexed manifest reaches (manifests, configs, layers, nested indexes) and
        that are not pinned by an in-flight write, stale temp files, and the cache symlink folders of
        manifests no longer indexed. Returns the removed blob digests, sorted. If an indexed manifest is
        unreadable, no blob is deleted (its layers are unknown)."""
        with self.layout.lock():
            index = self.layout.read_index()
            tops = [e["digest"] for e in _descriptors(index, "manifests")]
            reachable: set[str] = set()
            readable = all(self._reach(d, reachable) for d in tops)
            removed = []
            if readable and self.layout.others_writing():
                log.info("gc: another process is writing to the store; keeping unreferenced blobs for now")
            elif readable:
                present = self.layout.blob_digests()
                keep = reachable | self.layout.pinned()
                for digest in present:
                    if digest not in keep:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self.layout.blob_path(digest))
                        removed.append(digest)
                if removed:
                    self.layout.changed()
                self.layout.forget_verified(removed)
                if self.layout.verified_dir.is_dir():  # and the records of blobs gone by other means
                    kept = set(present) - set(removed)
                    self.layout.forget_verified(f"sha256:{p.name}" for p in self.layout.verified_dir.iterdir()
                                                if _HEX.fullmatch(p.name) and f"sha256:{p.name}" not in kept)
            else:
                log.warning("gc: an indexed manifest is unreadable; keeping every blob")
            self.layout.remove_stale_temps()
            live = {d.split(":", 1)[1] for d in tops}
            if self.cache_dir.is_dir():
                for folder in self.cache_dir.iterdir():
                    if _HEX.fullmatch(folder.name) and folder.name not in live and not folder.is_symlink():
                        shutil.rmtree(folder, ignore_errors=True)
            return sorted(removed)

    def _reach(self, digest: str, seen: set[str]) -> bool:
        if digest in seen:
            return True
        seen.add(digest)
        try:
            manifest = json.loads(self.layout.read_blob(digest))
        except (StoreError, ValueError):
            return False
        if not isinstance(manifest, dict):
            return False
        seen.update(d["digest"] for key in ("config", "layers") for d in _descriptors(manifest, key))
        return all(self._reach(d["digest"], seen) for d in _descriptors(manifest, "manifests"))


def _descriptors(manifest: dict[str, Any], key: str) -> builtins.list[dict[str, Any]]:
    value = manifest.get(key)
    items = [value] if isinstance(value, dict) else value if isinstance(value, builtins.list) else []
    return [d for d in items if isinstance(d, dict) and isinstance(d.get("digest"), str)]


def _size(desc: dict[str, Any]) -> int | None:
    size = desc.get("size")
    return size if isinstance(size, int) else None
