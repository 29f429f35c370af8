"""Other tools' model folders, laid out as those tools write them, around the real GGUFs (for the
``llmman import`` tests).

* :func:`ollama_store`: Ollama's ``models/`` folder: ``blobs/sha256-<hex>`` and
  ``manifests/<host>/<namespace>/<model>/<tag>`` (a Docker v2 manifest with Ollama's layer types and a
  Docker image config, as ``ollama pull`` leaves them).
* :func:`hf_cache`: a Hugging Face hub cache repository: ``models--ORG--NAME/blobs/<sha256>``,
  ``snapshots/<rev>/<path>`` relative symlinks to them, ``refs/main``.

The weights go in as a hard link to the given file where one file system allows (the user's one copy),
else as a copy; ``copy=True`` always copies (for a test that changes the source).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
OLLAMA = "application/vnd.ollama.image."


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def place(source: Path, target: Path, *, copy: bool = False) -> None:
    """``target`` holding ``source``'s bytes: a hard link when possible (and not ``copy``), else a copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # the same blob again (two tags of one model)
        return
    if not copy:
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    shutil.copyfile(source, target)


def ollama_blob(models: Path, data: bytes) -> dict[str, Any]:
    """A small blob under ``models/blobs``; returns its descriptor (without mediaType)."""
    hexd = hashlib.sha256(data).hexdigest()
    (models / "blobs").mkdir(parents=True, exist_ok=True)
    (models / "blobs" / f"sha256-{hexd}").write_bytes(data)
    return {"digest": f"sha256:{hexd}", "size": len(data)}


def ollama_store(models: Path, gguf: Path, *, host: str = "registry.ollama.ai", repo: str = "library/smollm2",
                 tag: str = "135m", system: str | None = None, params: dict[str, Any] | None = None,
                 template: str = "{{ .Prompt }}", license_text: str | None = "Apache 2.0",
                 extra: Sequence[tuple[str, bytes]] = (), copy: bool = False) -> Path:
    """Add one model to an Ollama ``models`` folder; returns its manifest file. ``extra``: more layers
    (media type suffix, bytes), e.g. ``("adapter", b"...")``, ``("projector", gguf bytes)``."""
    hexd = sha256_file(gguf)
    place(gguf, models / "blobs" / f"sha256-{hexd}", copy=copy)
    layers = [{"mediaType": OLLAMA + "model", "digest": f"sha256:{hexd}", "size": gguf.stat().st_size}]
    small: list[tuple[str, bytes]] = [("template", template.encode())]
    if license_text is not None:
        small.append(("license", license_text.encode()))
    if system is not None:
        small.append(("system", system.encode()))
    if params is not None:
        small.append(("params", json.dumps(params).encode()))
    for kind, data in [*small, *extra]:
        layers.append({"mediaType": OLLAMA + kind, **ollama_blob(models, data)})
    config = json.dumps({"model_format": "gguf", "model_family": "llama", "model_families": ["llama"],
                         "model_type": "135M", "file_type": "Q4_1", "architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in layers]}}).encode()
    manifest = {"schemaVersion": 2, "mediaType": DOCKER_V2,
                "config": {"mediaType": DOCKER_CONFIG, **ollama_blob(models, config)}, "layers": layers}
    path = models / "manifests" / host / repo / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def hf_cache(hub: Path, repo: str, files: dict[str, Path], *, revision: str = "a" * 40,
             copy: bool = False) -> Path:
    """Add ``files`` (path in the repository -> local file) to the cache repository ``repo``
    (``ORG/NAME``) at ``revision``, which ``refs/main`` then names; returns the snapshot folder."""
    folder = hub / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / revision
    for rel, source in files.items():
        hexd = sha256_file(source)
        place(source, folder / "blobs" / hexd, copy=copy)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(folder / "blobs" / hexd, link.parent))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
    return snapshot
