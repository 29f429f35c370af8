"""Pushing a model to a real OCI registry in Ollama's own registry format, with httpx and the OCI
distribution API (distribution-spec 1.1: ``POST /v2/<repo>/blobs/uploads/`` then a monolithic ``PUT
<location>?digest=``; ``PUT /v2/<repo>/manifests/<tag>``), as ``ollama push`` leaves a model in a
registry: a Docker v2 manifest, a Docker image config, ``application/vnd.ollama.image.*`` layers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.user_stores import DOCKER_CONFIG, DOCKER_V2, OLLAMA


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            yield chunk


def push_blob(client: httpx.Client, repo: str, data: bytes | Path) -> dict[str, Any]:
    """Upload one blob (bytes, or a file streamed); returns its descriptor (digest, size)."""
    if isinstance(data, Path):
        h = hashlib.sha256()
        for chunk in _chunks(data):
            h.update(chunk)
        digest, size, body = f"sha256:{h.hexdigest()}", data.stat().st_size, _chunks(data)
    else:
        digest, size, body = f"sha256:{hashlib.sha256(data).hexdigest()}", len(data), iter([data])
    start = client.post(f"/v2/{repo}/blobs/uploads/")
    assert start.status_code == 202, start.text
    location = start.headers["location"]
    url = f"{location}{'&' if '?' in location else '?'}digest={digest}"  # the upload's own query kept
    done = client.put(url, content=body,
                      headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
    assert done.status_code == 201, done.text
    return {"digest": digest, "size": size}


def push_ollama_model(registry: str, repo: str, tag: str, gguf: Path, *, system: str | None = None,
                      params: dict[str, Any] | None = None) -> str:
    """Push ``gguf`` (plus a template, a license, and ``system``/``params`` layers when given) to
    ``http://<registry>/v2/<repo>`` under ``tag``; returns the manifest digest."""
    with httpx.Client(base_url=f"http://{registry}", timeout=120) as client:
        layers = [{"mediaType": OLLAMA + "model", **push_blob(client, repo, gguf)}]
        small = [("template", b"{{ .Prompt }}"), ("license", b"Apache 2.0")]
        if system is not None:
            small.append(("system", system.encode()))
        if params is not None:
            small.append(("params", json.dumps(params).encode()))
        for kind, data in small:
            layers.append({"mediaType": OLLAMA + kind, **push_blob(client, repo, data)})
        rootfs = {"type": "layers", "diff_ids": [d["digest"] for d in layers]}
        config = json.dumps({"model_format": "gguf", "model_family": "llama", "file_type": "Q4_1",
                             "rootfs": rootfs}).encode()
        manifest = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_V2,
                               "config": {"mediaType": DOCKER_CONFIG, **push_blob(client, repo, config)},
                               "layers": layers}).encode()
        r = client.put(f"/v2/{repo}/manifests/{tag}", content=manifest, headers={"Content-Type": DOCKER_V2})
        assert r.status_code == 201, r.text
        return f"sha256:{hashlib.sha256(manifest).hexdigest()}"
