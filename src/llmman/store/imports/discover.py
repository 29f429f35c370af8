"""From a path or a keyword to the models under it: which recogniser reads which folder.

A path is one GGUF file (with the other shards of its split set and a projector beside it), one manifest
file of an Ollama store (that model alone), an Ollama store (a folder with ``manifests/`` and ``blobs/``),
one Hugging Face cache repository (``models--ORG--NAME``), or any folder, walked to any depth: inside it,
an Ollama store or a hub-cache
repository is read by its recogniser (and not walked further), every other folder's GGUF files by
:func:`llmman.store.imports.ggufdir.scan_folder` (llama.cpp's cache manifests first). Hidden folders
(``.name``) are not walked. Keywords (``ollama``, ``hf``, ``llama.cpp``, ``lmstudio``) name the folders of
:class:`llmman.config.model_dirs.ModelDirs`; LM Studio's ``<publisher>/<repository>/`` folders are named
as the Hugging Face repositories they came from.
"""

from __future__ import annotations

import os
from pathlib import Path

from llmman.config.model_dirs import KEYWORDS, ModelDirs
from llmman.errors import NotFound
from llmman.store.imports.found import SPLIT, Found
from llmman.store.imports.ggufdir import llama_cpp_manifests, scan_folder
from llmman.store.imports.hfcache import is_hf_repo, scan_hf_repo
from llmman.store.imports.ollama import is_ollama_store, ollama_manifest, scan_ollama

__all__ = ["discover", "discover_sources", "sources_of"]


def sources_of(words: list[str] | tuple[str, ...], dirs: ModelDirs) -> list[tuple[Path, bool]]:
    """``(folder or file, is LM Studio's)`` for each SOURCE word: a keyword's folders (only those that
    exist), or the path itself. No words: every keyword's folders that exist."""
    out: list[tuple[Path, bool]] = []
    for word in words or KEYWORDS:
        if word in KEYWORDS:
            out.extend((p, word == "lmstudio") for p in dirs.of(word) if p.is_dir())
        else:
            out.append((Path(word).expanduser(), False))
    return out


def _single(path: Path) -> list[Found]:
    """One GGUF file given by path: its model (all its shards) with a projector beside it."""
    folder = path.parent
    siblings = [p for p in folder.iterdir() if p.is_file() and p.name.lower().endswith(".gguf")]
    m = SPLIT.fullmatch(path.name)
    same = [p for p in siblings if (n := SPLIT.fullmatch(p.name)) is not None and m is not None
            and (n["prefix"], n["count"]) == (m["prefix"], m["count"])]
    files = {path, *same, *(p for p in siblings if p.name.lower().startswith("mmproj"))}
    found = scan_folder(sorted(files))
    mine = [f for f in found if f.source == path or any(p.path == path for p in f.parts)]
    if not mine and path.name.lower().startswith("mmproj"):
        return [Found(str(path), path, problem="a vision projector, not a model")]
    return mine or [Found(str(path), path, problem="not a GGUF file")]


def discover(path: Path, *, lmstudio: bool = False) -> list[Found]:
    """Every model under ``path`` (rules in the module docstring); ``lmstudio``: ``path`` is LM Studio's
    models folder. Raises NotFound when ``path`` does not exist."""
    if path.is_file():
        manifest = ollama_manifest(path)
        return [manifest] if manifest is not None else _single(path)
    if not path.is_dir():
        raise NotFound(f"{path}: no such file or directory (a SOURCE is a folder, a GGUF file, or one of "
                       f"{', '.join(KEYWORDS)})")
    if is_ollama_store(path):
        return scan_ollama(path)
    if is_hf_repo(path):
        return scan_hf_repo(path)
    found: list[Found] = []
    for folder, dirs, files in os.walk(path):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        keep = []
        for d in dirs:
            sub = here / d
            if is_ollama_store(sub):
                found.extend(scan_ollama(sub))
            elif is_hf_repo(sub):
                found.extend(scan_hf_repo(sub))
            else:
                keep.append(d)
        dirs[:] = keep
        ggufs = [here / f for f in sorted(files) if f.lower().endswith(".gguf")]
        if not ggufs:
            continue
        cached, claimed = llama_cpp_manifests(here)
        found.extend(cached)
        rel = here.relative_to(path).parts
        repo = "/".join(rel) if lmstudio and len(rel) == 2 else None
        found.extend(scan_folder([p for p in ggufs if p not in claimed], repo))
    return found


def discover_sources(sources: list[tuple[Path, bool]]) -> list[Found]:
    """Every model of every source, in order; a name found twice is kept the first time, and each later
    one is listed as skipped (import it alone with ``--name``)."""
    seen: dict[str, Path] = {}
    out: list[Found] = []
    for path, lmstudio in sources:
        for item in discover(path, lmstudio=lmstudio):
            if not item.problem:
                first = seen.setdefault(item.name.lower(), item.source)
                if first != item.source:
                    item = Found(item.name, item.source, problem=f"the same name as {first}; import it "
                                                                  "alone with --name")
            out.append(item)
    return out
