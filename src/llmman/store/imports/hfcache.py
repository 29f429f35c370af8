"""Recognising the Hugging Face hub cache (``~/.cache/huggingface/hub``, ``$HF_HUB_CACHE``).

huggingface_hub keeps ``models--ORG--NAME/snapshots/<revision>/<path>`` as symlinks to
``models--ORG--NAME/blobs/<etag>``; a file stored with Git LFS (every GGUF) has its sha256 as etag, so
the blob's name is its digest. ``refs/main`` names the revision ``main`` was at.

Each GGUF model in a repository (one file, or the shards of a split ``-0000k-of-0000n.gguf`` set)
becomes ``hf.co/ORG/NAME:<tag>``, the tag as :func:`llmman.store.imports.found.file_tag` gives it (the
quantisation, as ``llmman pull hf.co/ORG/NAME:Q4_K_M`` picks that file); when two models of one
repository would share a tag, each takes its file stem instead. The repository's ``mmproj*.gguf`` (F16,
BF16, F32 preferred, as a pull picks it) is the projector of every model in it. Files of every cached
revision count, ``main``'s first, then newer snapshots; a path seen in an earlier one is not taken again.
A model's source is its repository folder, so importing it again after a newer revision was downloaded
updates it.
"""

from __future__ import annotations

import re
from pathlib import Path

from llmman.store import mediatypes as mt
from llmman.store.imports.found import SPLIT, Found, Part, file_tag, is_gguf, split_stem, valid_name

__all__ = ["is_hf_repo", "scan_hf_repo"]

_ETAG = re.compile(r"[0-9a-f]{64}")
_MMPROJ_ORDER = ("-f16.gguf", "-bf16.gguf", "-f32.gguf")


def is_hf_repo(folder: Path) -> bool:
    """True when ``folder`` is one model repository of the hub cache (``models--*`` with snapshots)."""
    return folder.name.startswith("models--") and (folder / "snapshots").is_dir()


def _snapshots(repo: Path) -> list[Path]:
    snaps = [p for p in (repo / "snapshots").iterdir() if p.is_dir()]
    try:
        main = (repo / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    return sorted(snaps, key=lambda p: (p.name != main, -p.stat().st_mtime))


def _files(repo: Path) -> dict[str, Path]:
    """``relative path -> snapshot file`` of every ``*.gguf`` of every revision (``main`` first)."""
    files: dict[str, Path] = {}
    for snap in _snapshots(repo):
        for path in sorted(snap.rglob("*.gguf")):
            rel = path.relative_to(snap).as_posix()
            if rel not in files and path.is_file():
                files[rel] = path
    return files


def _part(path: Path, name: str, mmproj: bool = False) -> Part:
    blob = path.resolve()
    digest = f"sha256:{blob.name}" if _ETAG.fullmatch(blob.name) else None
    return Part(blob, mt.MODEL_WEIGHT_RAW, blob.stat().st_size, digest=digest, filename=name, mmproj=mmproj)


def scan_hf_repo(repo: Path) -> list[Found]:
    """The GGUF models of one ``models--ORG--NAME`` folder (see the module docstring)."""
    _, _, rest = repo.name.partition("models--")
    org, sep, name = rest.partition("--")
    base = f"hf.co/{org}/{name}" if sep else ""
    files = {rel: p for rel, p in _files(repo).items() if "imatrix" not in rel.lower()}
    projectors = [rel for rel in files if "mmproj" in rel.rsplit("/", 1)[-1].lower()]
    mmproj = next((rel for s in _MMPROJ_ORDER for rel in projectors if rel.lower().endswith(s)),
                  projectors[0] if projectors else None)
    groups: dict[str, list[str]] = {}
    for rel in files:
        if rel in projectors:
            continue
        m = SPLIT.fullmatch(rel.rsplit("/", 1)[-1])
        key = f"{rel.rsplit('/', 1)[0] if '/' in rel else ''}/{m['prefix']}-{m['count']}" if m else rel
        groups.setdefault(key, []).append(rel)
    tags = {key: file_tag(rels[0]) for key, rels in groups.items()}
    shared = {t for t in tags.values() if list(tags.values()).count(t) > 1}
    found = []
    for key, rels in sorted(groups.items()):
        rels.sort()
        tag = tags[key] if tags[key] not in shared else split_stem(rels[0])
        ref = valid_name(f"{base}:{tag}") if base else None
        first = files[rels[0]]
        if ref is None:
            found.append(Found(f"{repo.name}/{rels[0]}", first, problem="no valid hf.co name for it"))
            continue
        m = SPLIT.fullmatch(rels[0].rsplit("/", 1)[-1])
        if m is not None and len(rels) != int(m["count"]):
            found.append(Found(ref, first, problem=f"only {len(rels)} of its {int(m['count'])} shards are "
                                                   "in the cache"))
            continue
        if not all(is_gguf(files[r]) for r in rels):
            found.append(Found(ref, first, problem="a file is not a GGUF (an interrupted download?)"))
            continue
        parts = [_part(files[r], r.rsplit("/", 1)[-1]) for r in rels]
        if mmproj is not None and is_gguf(files[mmproj]):
            parts.append(_part(files[mmproj], mmproj.rsplit("/", 1)[-1], mmproj=True))
        found.append(Found(ref, repo, tuple(parts)))  # the repository: the same across revisions
    return found
