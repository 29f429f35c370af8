"""Pulling GGUF models from Hugging Face (``hf.co/owner/repo[:quant]``) through ``huggingface_hub``.

Rules: the endpoint is passed in (``HF_ENDPOINT`` as :mod:`llmman.config.environment` reads it, default
https://huggingface.co); the token is ``HF_TOKEN`` or huggingface_hub's token file, which huggingface_hub
reads itself. The repository's
commit comes from the model info; the file list from the recursive tree. Among ``*.gguf`` files that are
not ``mmproj``/``imatrix``: an explicit tag (not ``latest``) picks the first whose path contains it
(case-insensitive) or fails listing what exists; else the first of :data:`QUANT_ORDER`; else the
smallest. A pick named ``<prefix>-NNNNN-of-MMMMM.gguf`` brings all its shards, in order. Also an
``mmproj*.gguf`` (F16, BF16, F32 preferred) and ``LICENSE``/``LICENSE.md``/``LICENSE.txt``.

Files download into ``<store>/partial/hf/`` (resumable by huggingface_hub), are verified against the
LFS sha256 the tree lists (and hashed anyway), then renamed into ``blobs/``; the result is a CNCF
ModelPack manifest named after the reference. Nothing enters the index unless every file arrived.

Offline (``server.offline``, a Hub on this machine): huggingface_hub's shared HTTP client gets a transport
that refuses, before connecting, any host off this machine (a redirect to a CDN included) while an
offline pull runs in the thread, and drops the Xet headers from answers so no download leaves
huggingface_hub's HTTP client for hf_xet's own connections.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmman.config.environment import HF_DEFAULT_ENDPOINT
from llmman.errors import LlmmanError, StoreError
from llmman.refs import DEFAULT_TAG, Reference
from llmman.registry.client import (
    OfflineRefused,
    RegistryError,
    RegistryNotFound,
    RegistryUnavailable,
    may_connect,
    summarise,
)
from llmman.registry.puller import Emit
from llmman.store import Store, StoredModel
from llmman.store import mediatypes as mt

QUANT_ORDER = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q8_0", "Q4_0", "Q6_K", "Q2_K")
_SPLIT = re.compile(r"(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_LICENSES = ("license", "license.md", "license.txt")


def select_files(files: dict[str, int], tag: str) -> tuple[list[str], str | None, str | None]:
    """(GGUF shards in order, mmproj or None, license or None) from ``path -> size``.

    Raises RegistryNotFound when no GGUF matches (the message lists the available ones)."""
    ggufs = [p for p in files if p.lower().endswith(".gguf")
             and "mmproj" not in p.lower() and "imatrix" not in p.lower()]
    if not ggufs:
        raise RegistryNotFound("the repository has no GGUF file")
    if tag != DEFAULT_TAG:
        pick = next((p for p in ggufs if tag.lower() in p.lower()), None)
        if pick is None:
            raise RegistryNotFound(f"no GGUF file matches {tag!r}; available: {', '.join(sorted(ggufs))}")
    else:
        pick = next((p for q in QUANT_ORDER for p in ggufs if q.lower() in p.lower()), None)
        pick = pick or min(ggufs, key=lambda p: files[p])
    shards = [pick]
    m = _SPLIT.search(pick)
    if m:
        same = [p for p in ggufs if (n := _SPLIT.search(p)) and n["prefix"] == m["prefix"]
                and n["count"] == m["count"]]
        shards = sorted(same, key=lambda p: int(_SPLIT.search(p)["no"]))  # type: ignore[index]
    projectors = [p for p in files
                  if p.lower().endswith(".gguf") and "mmproj" in p.rsplit("/", 1)[-1].lower()]
    mmproj = next((p for s in ("-f16.gguf", "-bf16.gguf", "-f32.gguf") for p in projectors
                   if p.lower().endswith(s)), projectors[0] if projectors else None)
    lic = next((p for p in files if p.lower() in _LICENSES), None)
    return shards, mmproj, lic


def _tqdm_for(emit: Emit, status: str, digest: str, total: int) -> type:
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    class Progress(tqdm):  # type: ignore[misc]
        """No terminal output; each update becomes a progress line."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self.done = int(kwargs.get("initial") or 0)

        def update(self, n: float | None = 1) -> None:
            self.done += int(n or 0)
            emit({"status": status, "digest": digest, "total": total, "completed": self.done})

    return Progress


_OFFLINE = threading.local()  # .on while an offline pull runs in this thread
_INSTALL = threading.Lock()
_installed: list[bool] = []


def _install_guard() -> None:
    """Give huggingface_hub's shared client a transport that applies :data:`_OFFLINE` (once)."""
    import httpx2
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils import _http as hf_http

    class Guard(httpx2.BaseTransport):
        def __init__(self) -> None:
            self.inner = httpx2.HTTPTransport()

        def handle_request(self, request: httpx2.Request) -> httpx2.Response:
            if not getattr(_OFFLINE, "on", False):
                return self.inner.handle_request(request)
            host = request.url.host
            if not may_connect(host):
                raise OfflineRefused(f"Hugging Face: not connecting to {host[:100]}: llmman is offline "
                                     "(server.offline) and that host is not on this machine")
            response = self.inner.handle_request(request)
            for key in [k for k in response.headers if k.lower().startswith("x-xet-")]:
                del response.headers[key]
            if "xet" in response.headers.get("link", "").lower():
                del response.headers["link"]
            return response

        def close(self) -> None:
            self.inner.close()

    def factory() -> httpx2.Client:
        hook = getattr(hf_http, "hf_request_event_hook", None)
        return httpx2.Client(event_hooks={"request": [hook]} if hook else {}, follow_redirects=True,
                             timeout=None, transport=Guard())

    with _INSTALL:
        if not _installed:
            set_client_factory(factory)
            _installed.append(True)


@contextlib.contextmanager
def _offline(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    _install_guard()
    _OFFLINE.on = True
    try:
        yield
    finally:
        _OFFLINE.on = False


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"


def pull_huggingface(store: Store, ref: Reference, emit: Emit, *,
                     endpoint: str = HF_DEFAULT_ENDPOINT, offline: bool = False) -> StoredModel:
    """Pull ``ref`` (registry ``hf.co``) into ``store`` from the Hub at ``endpoint``; ``offline`` keeps
    every connection on this machine (see module docstring).

    Raises RegistryError subclasses (OfflineRefused), StoreError."""
    with _offline(offline):
        return _pull_huggingface(store, ref, emit, endpoint)


def _pull_huggingface(store: Store, ref: Reference, emit: Emit, endpoint: str) -> StoredModel:
    import httpx2  # huggingface_hub's HTTP client: its transport errors are not HfHubHTTPError
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub import errors as hf_errors

    emit({"status": "pulling manifest"})
    repo = ref.repository
    api = HfApi(endpoint=endpoint)
    written: list[str] = []
    try:
        sha = api.model_info(repo).sha or "main"
        tree = [f for f in api.list_repo_tree(repo, recursive=True, revision=sha) if hasattr(f, "size")]
        sizes = {f.path: int(f.size) for f in tree}
        lfs = {f.path: getattr(getattr(f, "lfs", None), "sha256", None) for f in tree}
        shards, mmproj, lic = select_files(sizes, ref.tag)
        where = store.root / "partial" / "hf" / repo.replace("/", "--") / sha
        layers: list[dict[str, Any]] = []
        for path in [*shards, *([mmproj] if mmproj else []), *([lic] if lic else [])]:
            expected = f"sha256:{lfs[path]}" if lfs.get(path) else None
            status = f"pulling {(lfs.get(path) or hashlib.sha256(path.encode()).hexdigest())[:12]}"
            size = sizes[path]
            if expected and store.has_blob(expected, size, pin=True):
                digest = expected
                emit({"status": status, "digest": digest, "total": size, "completed": size})
            else:
                local = Path(hf_hub_download(repo, path, revision=sha, local_dir=where, endpoint=endpoint,
                                             tqdm_class=_tqdm_for(emit, status, expected or "", size)))
                digest = _sha256(local)
                if expected and digest != expected:
                    local.unlink(missing_ok=True)
                    raise StoreError(f"{path} failed verification: sha256 {digest}, expected {expected}")
                store.layout.publish_file(local, digest)
                emit({"status": status, "digest": digest, "total": size, "completed": size})
            written.append(digest)
            name = path.rsplit("/", 1)[-1]
            media = mt.MODEL_DOC_RAW if path == lic else mt.MODEL_WEIGHT_RAW
            ann = {mt.FILEPATH: name, mt.TITLE: name}
            if path == mmproj:
                ann[mt.ROLE] = mt.ROLE_MMPROJ
            layers.append({"mediaType": media, "digest": digest, "size": size, "annotations": ann})
    except (hf_errors.RepositoryNotFoundError, hf_errors.RevisionNotFoundError,
            hf_errors.EntryNotFoundError) as exc:
        store.layout.unpin(written)
        raise RegistryNotFound(f"{ref}: {str(exc).splitlines()[0]}") from exc
    except hf_errors.HfHubHTTPError as exc:
        store.layout.unpin(written)
        response = getattr(exc, "response", None)
        answered = getattr(response, "status_code", None)
        if answered == 404:
            raise RegistryNotFound(f"{ref}: repository or file not found") from exc
        reason = summarise(answered, b"") if isinstance(answered, int) else type(exc).__name__
        raise RegistryError(f"{ref}: Hugging Face answered {reason}") from exc
    except httpx2.HTTPError as exc:  # unreachable endpoint, TLS failure, timeout, dropped connection
        store.layout.unpin(written)
        raise RegistryUnavailable(f"{ref}: cannot reach {endpoint}: "
                                  f"{exc or type(exc).__name__}") from exc
    except (OSError, ValueError) as exc:
        store.layout.unpin(written)
        if isinstance(exc, LlmmanError):
            raise
        raise RegistryUnavailable(f"{ref}: {exc}") from exc
    except BaseException:
        store.layout.unpin(written)
        raise
    return _store_manifest(store, ref, layers, mmproj is not None, emit)


def _store_manifest(store: Store, ref: Reference, layers: list[dict[str, Any]], vision: bool,
                    emit: Emit) -> StoredModel:
    emit({"status": "verifying sha256 digest"})
    config = {
        "descriptor": {"name": str(ref)},
        "config": {"format": "gguf",
                   "capabilities": {"inputTypes": ["text", "image"] if vision else ["text"],
                                    "outputTypes": ["text"]}},
        "modelfs": {"type": "layers", "diffIds": [d["digest"] for d in layers]},
    }
    config_bytes = json.dumps(config, separators=(",", ":")).encode()
    config_digest = store.write_blob([config_bytes])
    manifest = {
        "schemaVersion": 2, "mediaType": mt.OCI_MANIFEST, "artifactType": mt.MODEL_ARTIFACT,
        "config": {"mediaType": mt.MODEL_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": layers, "annotations": {"ai.model.repo": ref.repository},
    }
    emit({"status": "writing manifest"})
    model = store.put_manifest(ref, json.dumps(manifest, separators=(",", ":")).encode(), mt.OCI_MANIFEST)
    emit({"status": "success"})
    return model
