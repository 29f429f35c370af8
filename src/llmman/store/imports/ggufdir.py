"""Recognising plain GGUF files in one folder: single files, split shards, projectors; llama.cpp's cache.

In one folder: ``<prefix>-0000k-of-0000n.gguf`` files with one prefix and count are one model (every
shard must be there); every other ``*.gguf`` is a model of its own; ``mmproj*.gguf`` files are
projectors, and one of them (F16, BF16, F32 preferred) is the projector of every model beside it.
Names: :func:`llmman.store.imports.found.local_name` (``localhost/<stem>:<quant>``), or
``hf.co/<repo>:<tag>`` when the caller knows the folder is a Hugging Face repository's (LM Studio keeps
``models/<publisher>/<repository>/``, the repository's own name on Hugging Face).

llama.cpp's cache (``~/.cache/llama.cpp``, ``$LLAMA_CACHE``) keeps what ``llama-server -hf ORG/NAME:TAG``
downloaded as ``<ORG>_<NAME>_<file>.gguf`` beside ``manifest=<ORG>=<NAME>=<TAG>.json`` (the Hub's
manifest answer, naming ``ggufFile`` and ``mmprojFile`` by ``rfilename``): such files are imported as
``hf.co/ORG/NAME:TAG``, the others as plain GGUFs. Nothing here names files by digest: they are hashed
at import.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmman.store import mediatypes as mt
from llmman.store.imports.found import (
    SPLIT,
    Found,
    Part,
    file_tag,
    is_gguf,
    local_name,
    split_stem,
    valid_name,
)

__all__ = ["llama_cpp_manifests", "scan_folder"]

_MMPROJ_ORDER = ("-f16.gguf", "-bf16.gguf", "-f32.gguf")


def _part(path: Path, mmproj: bool = False) -> Part:
    return Part(path, mt.MODEL_WEIGHT_RAW, path.stat().st_size, filename=path.name, mmproj=mmproj)


def _projector(files: list[Path]) -> Path | None:
    projectors = [p for p in files if p.name.lower().startswith("mmproj") and is_gguf(p)]
    return next((p for s in _MMPROJ_ORDER for p in projectors if p.name.lower().endswith(s)),
                projectors[0] if projectors else None)


def scan_folder(files: list[Path], hf_repo: str | None = None) -> list[Found]:
    """The models among ``files`` (the ``*.gguf`` of one folder); ``hf_repo`` (``ORG/NAME``) names them
    ``hf.co/ORG/NAME:<tag>`` instead of ``localhost/...``."""
    mmproj = _projector(files)
    groups: dict[str, list[Path]] = {}
    for path in sorted(files):
        if path.name.lower().startswith("mmproj"):
            continue
        m = SPLIT.fullmatch(path.name)
        groups.setdefault(f"{m['prefix']}-{m['count']}" if m else path.name, []).append(path)
    tags = {key: file_tag(paths[0].name) for key, paths in groups.items()}
    found = []
    for key, paths in sorted(groups.items()):
        first = paths[0]
        if hf_repo is not None:
            shared = list(tags.values()).count(tags[key]) > 1
            name = valid_name(f"hf.co/{hf_repo}:{split_stem(first.name) if shared else tags[key]}")
        else:
            name = valid_name(local_name(first.name))
        if name is None:
            found.append(Found(str(first), first, problem="no valid model name for its file name; "
                                                          "import it alone with --name"))
            continue
        m = SPLIT.fullmatch(first.name)
        if m is not None and (len(paths) != int(m["count"]) or int(m["no"]) != 1):
            found.append(Found(name, first, problem=f"{len(paths)} of its {int(m['count'])} shards are "
                                                    "in the folder"))
            continue
        if not all(is_gguf(p) for p in paths):
            found.append(Found(name, first, problem="not a GGUF file"))
            continue
        parts = [_part(p) for p in paths]
        if mmproj is not None:
            parts.append(_part(mmproj, mmproj=True))
        found.append(Found(name, first, tuple(parts)))
    return found


def llama_cpp_manifests(folder: Path) -> tuple[list[Found], set[Path]]:
    """The models ``manifest=ORG=NAME=TAG.json`` files in ``folder`` describe, and the GGUF files they
    claim (so they are not found again as plain GGUFs)."""
    found: list[Found] = []
    claimed: set[Path] = set()
    for manifest in sorted(folder.glob("manifest=*.json")):
        bits = manifest.name[len("manifest="):-len(".json")].split("=")
        if len(bits) != 3:
            continue
        org, repo, tag = bits
        try:
            doc = json.loads(manifest.read_bytes()[: 1 << 20])
        except (OSError, ValueError):
            continue
        files = [_cached(folder, org, repo, doc.get(key)) for key in ("ggufFile", "mmprojFile")]
        model, mmproj = files
        name = valid_name(f"hf.co/{org}/{repo}:{tag}")
        if model is None or name is None:
            continue
        claimed.update(p for p in files if p is not None)
        if SPLIT.fullmatch(model.name) is not None:
            found.append(Found(name, model, problem="a split model in llama.cpp's cache: import its folder "
                                                    "with --name"))
            continue
        if not is_gguf(model):
            found.append(Found(name, model, problem="not a GGUF file (an interrupted download?)"))
            continue
        parts = [_part(model)]
        if mmproj is not None and is_gguf(mmproj):
            parts.append(_part(mmproj, mmproj=True))
        found.append(Found(name, model, tuple(parts)))
    return found, claimed


def _cached(folder: Path, org: str, repo: str, entry: object) -> Path | None:
    """The cached file of a manifest entry ``{"rfilename": ...}``: ``<ORG>_<NAME>_<file>`` (the slashes
    of a path in the repository as ``_``), or the bare file name; None when neither exists."""
    if not isinstance(entry, dict) or not isinstance(entry.get("rfilename"), str):
        return None
    rfilename = str(entry["rfilename"])
    for candidate in (f"{org}_{repo}_{rfilename.replace('/', '_')}", rfilename.rsplit("/", 1)[-1]):
        path = folder / candidate
        if "/" not in candidate and path.is_file():
            return path
    return None
