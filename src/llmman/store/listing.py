"""The store's listing kept in memory: every named model, current across processes, read from disk only
when something changed.

A listing (:class:`Listing`) is built from ``index.json`` and the manifests it names. It is reused while
both still stat the same: ``index.json`` (inode, device, size, mtime and ctime in nanoseconds; every write
replaces it by a rename, so each write is a new file with a new ctime) and the ``blobs/sha256/`` folder
(its mtime and ctime change whenever a blob is added, renamed over or removed, such as a manifest that a
``llmman verify`` found corrupt). Every process that writes the store (the daemon, ``llmman build``, ``rm``,
``tag``, a second daemon on the same store) changes one of them, so two ``stat`` calls tell whether a
listing is current; what it did not write itself is seen the same way as what it did.

**Timestamps that do not move.** A file system stamps times from a clock that ticks coarsely (a few
milliseconds; a second or two on some), so a write in the same tick as the one a listing saw could leave
every figure equal. As git does for its index ("racy git"), a listing whose stamps were less than
:data:`RACY_S` seconds old when it was read is not trusted: it is read again at each use until it was
read with stamps that old. A later write then happens after the tick the listing saw, and its ctime
differs.

**What is cached for good.** Manifests are content-addressed: a manifest read once is kept by its digest
for as long as the index names it (its blob's mtime, the model's ``modified_at``, is read at each
refresh). A model's GGUF header (the details of ``/api/tags``, the trained context of ``/v1/models``) is
kept by manifest digest with the ``stat`` of each of its GGUF blobs, and read again when one of them
changed (the rule of :func:`llmman.gguf.read_gguf`'s own cache, without its size bound).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from llmman.errors import StoreError
from llmman.gguf import GGUFInfo
from llmman.store import mediatypes as mt
from llmman.store.layout import Layout, digest_hex
from llmman.store.model import StoredModel, layer_role

if TYPE_CHECKING:
    from llmman.refs import Reference

log = logging.getLogger(__name__)
RACY_S = 2.0  # stamps younger than this when read may not change at the next write (coarse clocks)

#: What a ``stat`` of ``index.json`` or ``blobs/sha256/`` is compared on; None: the path is absent.
Stamp = tuple[int, int, int, int, int] | None


def stamp(path: str) -> Stamp:
    """``(inode, device, size, mtime_ns, ctime_ns)`` of ``path``, None when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _young(found: Stamp, now_ns: int) -> bool:
    return found is not None and max(found[3], found[4]) > now_ns - int(RACY_S * 1e9)


def entry_name(entry: object) -> tuple[str, str] | None:
    """``(ref.name annotation, digest)`` of an index entry, None for an entry without both."""
    if not isinstance(entry, dict):
        return None
    ann = entry.get("annotations")
    name = ann.get(mt.REF_NAME) if isinstance(ann, dict) else None
    digest = entry.get("digest")
    return (name, digest) if isinstance(name, str) and isinstance(digest, str) else None


def layers_size(manifest: dict[str, Any]) -> int:
    """A model's size: the sum of its layer sizes (config excluded, as Ollama reports it)."""
    layers = manifest.get("layers")
    items = layers if isinstance(layers, list) else [layers] if isinstance(layers, dict) else []
    return sum(d["size"] for d in items if isinstance(d, dict) and isinstance(d.get("digest"), str)
               and isinstance(d.get("size"), int))


def read_model(layout: Layout, entry: object,
               known: Mapping[str, tuple[dict[str, Any], int]] | None = None) -> StoredModel | None:
    """The model an index entry names: its manifest (read from its blob, or taken from ``known`` by
    digest) and the blob's mtime. None, with a warning, when the manifest is unreadable or not an object."""
    named = entry_name(entry)
    if named is None:
        return None
    name, digest = named
    try:
        path = blob_file(layout, digest)
        mtime = os.stat(path).st_mtime
        cached = known.get(digest) if known is not None else None
        if cached is None:
            with open(path, "rb") as f:
                manifest = json.loads(f.read())
            if not isinstance(manifest, dict):
                return None
            cached = manifest, layers_size(manifest)
    except (OSError, ValueError, StoreError) as exc:
        log.warning("skipping %s: unreadable manifest %s (%s)", name, digest, exc)
        return None
    return StoredModel(reference=name, digest=digest, size=cached[1], modified_at=mtime, manifest=cached[0])


def blob_file(layout: Layout, digest: str) -> str:
    """:meth:`Layout.blob_path` as a string, without building a Path (a listing stats thousands)."""
    return f"{os.fspath(layout.blobs)}{os.sep}{digest_hex(digest)}"


def names(ref: Reference, name: str, digest: str) -> bool:
    """True when ``ref`` names the index entry ``name`` (its ``ref.name``) with manifest ``digest``: the
    full name, case-insensitively; a digest-pinned reference names an entry of the same repository with
    that manifest digest. The one rule of :meth:`llmman.store.Store.find`, ``rm``, ``tag`` and ``verify``."""
    if ref.digest is not None:
        repo = f"{ref.registry}/{ref.repository}:".lower()
        return digest == ref.digest and name.lower().startswith(repo)
    return name.lower() == f"{ref.registry}/{ref.repository}:{ref.tag}".lower()


@dataclass(frozen=True, eq=False)
class Listing:
    """The store's named models at one moment, in index order (entries with an unreadable manifest left
    out), and, when read with details, each manifest's GGUF header (None when it cannot be read).

    Compared by identity: a route may keep what it renders from one listing (a new listing is a new
    object)."""

    models: tuple[StoredModel, ...]
    infos: Mapping[str, GGUFInfo | None] | None = field(default=None)

    @cached_property
    def by_name(self) -> dict[str, StoredModel]:
        """Each model by its lower-cased name (the first entry of a name, as :meth:`find` reads)."""
        out: dict[str, StoredModel] = {}
        for model in self.models:
            out.setdefault(model.reference.lower(), model)
        return out

    @cached_property
    def sizes(self) -> dict[str, int]:
        """``{name: size}`` of every model (``/llmman/node``'s ``stored``). Do not modify it."""
        return {m.reference: m.size for m in self.models}

    def find(self, ref: Reference) -> StoredModel | None:
        """The model ``ref`` names (the rule of :func:`names`), or None."""
        if ref.digest is None:
            return self.by_name.get(f"{ref.registry}/{ref.repository}:{ref.tag}".lower())
        return next((m for m in self.models if names(ref, m.reference, m.digest)), None)

    def info(self, digest: str) -> GGUFInfo | None:
        """The GGUF header of the manifest ``digest`` (None when unreadable or not read)."""
        return self.infos.get(digest) if self.infos is not None else None


@dataclass(frozen=True)
class _State:
    stamps: tuple[Stamp, Stamp]
    trusted: bool  # read with stamps older than RACY_S
    blobs_trusted: bool  # the blobs/ stamp alone was
    generation: int  # the layout's in-process write count when read
    listing: Listing


class StoreIndex:
    """The current :class:`Listing` of one layout, kept in memory (see the module docstring).

    ``read_info`` reads a model's GGUF header (:meth:`llmman.store.Store.info`); ``clock`` is the wall
    clock file times are compared with (``time.time``). Thread-safe: one refresh at a time."""

    def __init__(self, layout: Layout, read_info: Callable[[StoredModel], GGUFInfo],
                 clock: Callable[[], float] = time.time) -> None:
        self._layout = layout
        self._read_info = read_info
        self._clock = clock
        self._index_path = os.fspath(layout.index_path)
        self._blobs_path = os.fspath(layout.blobs)
        self._state: _State | None = None
        self._lock = threading.Lock()
        self._manifests: dict[str, tuple[dict[str, Any], int]] = {}
        self._infos: dict[str, tuple[tuple[Stamp, ...], GGUFInfo | None]] = {}
        self._infos_blobs: tuple[Stamp, bool] = None, False  # blobs/ when _infos was read, and trusted
        self.refreshes = 0  # listings read from disk (a figure for tests and benchmarks)

    def _stamps(self) -> tuple[Stamp, Stamp]:
        return stamp(self._index_path), stamp(self._blobs_path)

    def current(self, *, details: bool = False) -> Listing | None:
        """The kept listing when it is provably current (two ``stat`` calls, no read), else None.
        ``details``: only one read with the GGUF headers."""
        state = self._state
        if state is None or not state.trusted or state.generation != self._layout.generation:
            return None
        if details and state.listing.infos is None:
            return None
        return state.listing if self._stamps() == state.stamps else None

    def listing(self, *, details: bool = False) -> Listing:
        """The current listing: the kept one when :meth:`current`, else read from disk now (index,
        manifests not seen before, and with ``details`` the GGUF headers of files that changed)."""
        found = self.current(details=details)
        if found is not None:
            return found
        with self._lock:
            found = self.current(details=details)  # another thread may have just read it
            if found is not None:
                return found
            state = self._state
            if details and state is not None and self.current() is state.listing:  # only the headers
                listing = Listing(state.listing.models, self._details(state))
                self._state = replace(state, listing=listing)
                return listing
            return self._refresh(details)

    def for_lookup(self) -> Listing | None:
        """A listing to look one name up in: the kept one when current, else one read now if it will be
        kept (the store's stamps are old enough to trust), else None: the caller reads ``index.json``
        itself, which for one name is cheaper than a listing read again at each use. Never waits for a
        refresh another thread is making (None then too)."""
        found = self.current()
        if found is not None:
            return found
        now_ns = int(self._clock() * 1e9)
        if any(_young(s, now_ns) for s in self._stamps()) or not self._lock.acquire(blocking=False):
            return None
        try:
            listing = self.current() or self._refresh(False)
        finally:
            self._lock.release()
        return listing if self.current() is listing else None

    def _refresh(self, details: bool) -> Listing:
        generation = self._layout.generation
        stamps = self._stamps()  # before reading: a write after this changes them for the next check
        now_ns = int(self._clock() * 1e9)
        entries = self._layout.read_index()["manifests"]
        # No blob was added, replaced or removed since a trusted read (every put of a manifest writes a
        # temp file in blobs/ before it touches the blob's mtime): the manifests' mtimes stand.
        before = self._state
        same_blobs = before is not None and before.blobs_trusted and before.stamps[1] == stamps[1]
        mtimes = {m.digest: m.modified_at for m in before.listing.models} if same_blobs and before else {}
        models = []
        for entry in entries:
            named = entry_name(entry) if mtimes else None
            known = self._manifests.get(named[1]) if named is not None else None
            if named is not None and known is not None and named[1] in mtimes:
                models.append(StoredModel(reference=named[0], digest=named[1], size=known[1],
                                          modified_at=mtimes[named[1]], manifest=known[0]))
                continue
            model = read_model(self._layout, entry, self._manifests)
            if model is not None:
                models.append(model)
        self._manifests = {m.digest: (m.manifest, m.size) for m in models}
        self.refreshes += 1
        blobs_trusted = not _young(stamps[1], now_ns)
        state = _State(stamps, blobs_trusted and not _young(stamps[0], now_ns), blobs_trusted, generation,
                       Listing(tuple(models)))
        if details:
            state = replace(state, listing=Listing(state.listing.models, self._details(state)))
        self._state = state
        return state.listing

    def _details(self, state: _State) -> dict[str, GGUFInfo | None]:
        """The GGUF header of each model of ``state``: kept ones without a ``stat`` when no blob was added
        or removed since they were read (a trusted, unchanged ``blobs/`` stamp), else kept while their
        files stat the same, else read."""
        unchanged = self._infos_blobs == (state.stamps[1], True)
        infos: dict[str, tuple[tuple[Stamp, ...], GGUFInfo | None]] = {}
        for model in state.listing.models:
            if model.digest in infos:
                continue
            kept = self._infos.get(model.digest)
            if unchanged and kept is not None:
                infos[model.digest] = kept
                continue
            files = self._files(model)
            if kept is None or kept[0] != files:
                try:
                    kept = files, self._read_info(model)
                except Exception as exc:  # a model whose file cannot be read still lists, without details
                    log.debug("no GGUF details for %s: %s", model.reference, exc)
                    kept = files, None
            infos[model.digest] = kept
        self._infos = infos
        self._infos_blobs = state.stamps[1], state.blobs_trusted
        return {digest: info for digest, (_, info) in infos.items()}

    def _files(self, model: StoredModel) -> tuple[Stamp, ...]:
        """The stamps of ``model``'s GGUF blobs (None for one absent or with a malformed digest)."""
        out: list[Stamp] = []
        for desc in model.layers:
            if layer_role(desc) in ("model", "mmproj"):
                try:
                    out.append(stamp(blob_file(self._layout, str(desc.get("digest")))))
                except StoreError:
                    out.append(None)
        return tuple(out)
