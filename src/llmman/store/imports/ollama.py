"""Recognising Ollama's model store (``~/.ollama/models``, ``$OLLAMA_MODELS``).

Ollama keeps ``manifests/<host>/<namespace>/<model>/<tag>`` (a Docker v2 manifest, JSON) naming blobs
``blobs/sha256-<hex>`` (``sha256:<hex>`` in old versions) by their digest. Its layers:
``application/vnd.ollama.image.model`` (the GGUF weights), ``.projector`` (vision), ``.adapter`` (LoRA),
``.template`` (a Go chat template), ``.params`` (JSON options), ``.system``, ``.messages``, ``.license``.

Each manifest becomes one :class:`Found` named ``<host>/<namespace>/<model>:<tag>``, with Ollama's own
registry ``registry.ollama.ai`` shown as ``ollama.com`` (the name users see on Ollama's site):
``ollama.com/library/llama3.2:3b``; ``hf.co/...`` models pulled by Ollama from Hugging Face keep their
``hf.co`` name. The weights and projector are linked; the config and the small layers are copied.
The template is kept in the manifest but not used (llama-server applies the GGUF's own chat
template); a model with an adapter layer is skipped (llmman cannot apply it, and its base alone would
answer as a different model).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from llmman.store import mediatypes as mt
from llmman.store.imports.found import Found, Part, is_gguf, valid_name

__all__ = ["OLLAMA_HOST", "is_ollama_store", "ollama_manifest", "scan_ollama"]

OLLAMA_HOST = "registry.ollama.ai"
SHOWN_HOST = "ollama.com"
_HEX = re.compile(r"sha256:([0-9a-f]{64})")
_MAX_MANIFEST = 1 << 20  # bytes: a manifest is a few hundred


def is_ollama_store(folder: Path) -> bool:
    """True when ``folder`` holds Ollama's ``manifests/`` and ``blobs/``."""
    return (folder / "manifests").is_dir() and (folder / "blobs").is_dir()


def blob_file(root: Path, digest: str) -> Path | None:
    """Ollama's file for ``digest`` under ``root/blobs`` (``sha256-<hex>``, or the old ``sha256:<hex>``),
    or None when absent or the digest is malformed."""
    m = _HEX.fullmatch(digest)
    if m is None:
        return None
    for name in (f"sha256-{m[1]}", f"sha256:{m[1]}"):
        path = root / "blobs" / name
        if path.is_file():
            return path
    return None


def model_name(parts: tuple[str, ...]) -> str | None:
    """The reference for a manifest at ``manifests/<parts...>`` (host, namespace..., model, tag), or None
    when it does not make one."""
    if len(parts) < 3:
        return None
    host, *repository, tag = parts
    host = SHOWN_HOST if host.lower() == OLLAMA_HOST else host
    return valid_name(f"{host}/{'/'.join(repository)}:{tag}")


def scan_ollama(root: Path) -> list[Found]:
    """Every model of the Ollama store at ``root``, in name order (problems included, as skipped); hidden
    files and folders (``.DS_Store``) are not manifests."""
    found = []
    top = root / "manifests"
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for file in sorted(f for f in files if not f.startswith(".")):
            path = Path(folder) / file
            rel = path.relative_to(top).parts
            name = model_name(rel)
            if name is None:
                found.append(Found("/".join(rel), path, problem="not a model name Ollama would write"))
                continue
            found.append(_one(root, path, name))
    return found


def ollama_manifest(path: Path) -> Found | None:
    """The model of one manifest file inside an Ollama store (``llmman import
    ~/.ollama/models/manifests/registry.ollama.ai/library/llama3.2/3b --name llama3.2:3b``), or None when
    ``path`` is not under an Ollama store's ``manifests/``."""
    for parent in path.parents:
        if parent.name == "manifests" and is_ollama_store(parent.parent):
            name = model_name(path.relative_to(parent).parts)
            if name is None:
                return Found(str(path), path, problem="not a model name Ollama would write")
            return _one(parent.parent, path, name)
    return None


def _one(root: Path, path: Path, name: str) -> Found:
    try:
        if path.stat().st_size > _MAX_MANIFEST:
            return Found(name, path, problem="manifest larger than 1 MiB")
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        return Found(name, path, problem=f"unreadable manifest: {exc}")
    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list):
        return Found(name, path, problem="not a manifest with layers")
    config = doc.get("config")
    descs: list[Any] = [config, *doc["layers"]] if isinstance(config, dict) else list(doc["layers"])
    parts: list[Part] = []
    notes: list[str] = []
    for desc in descs:
        if not isinstance(desc, dict) or not isinstance(desc.get("digest"), str) \
                or not isinstance(desc.get("size"), int):
            return Found(name, path, problem="a malformed layer descriptor")
        media, digest = str(desc.get("mediaType") or ""), str(desc["digest"])
        file = blob_file(root, digest)
        if file is None:
            return Found(name, path, problem=f"blob {digest} is missing from {root / 'blobs'}")
        if media == mt.OLLAMA_ADAPTER:
            return Found(name, path, problem="it has a LoRA adapter layer, which llmman cannot apply")
        weights = media in (mt.OLLAMA_MODEL, mt.OLLAMA_PROJECTOR)
        if weights and not is_gguf(file):
            return Found(name, path, problem=f"its {media.rsplit('.', 1)[-1]} layer is not a GGUF file")
        if media == mt.OLLAMA_TEMPLATE:
            notes.append("its Go template is kept but not used: llama-server applies the GGUF's own chat "
                         "template")
        parts.append(Part(file, media, int(desc["size"]), digest=digest, link=weights,
                          mmproj=media == mt.OLLAMA_PROJECTOR))
    if not any(p.media_type == mt.OLLAMA_MODEL for p in parts):
        return Found(name, path, problem="no model layer (application/vnd.ollama.image.model)")
    head = parts[0] if isinstance(config, dict) else None
    return Found(name, path, tuple(parts[1:] if head else parts), config=head, notes=tuple(notes))
