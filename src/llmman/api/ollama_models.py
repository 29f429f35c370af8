"""Ollama model-management and status routes: tags, ps, show, delete, copy, version, ``/``.

Shapes follow Ollama's ``api/types.go``: names always carry their tag and are identical in
``name`` and ``model`` (Open WebUI joins ``/api/tags`` and ``/api/ps`` on them), ``digest`` is the
manifest's hex without ``sha256:``, ``/api/show`` always has ``model_info``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from functools import partial
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from llmman.api.inference import Call, run
from llmman.api.listing import rendered, stored_listing
from llmman.api.ollama_infer import json_response
from llmman.api.services import Services
from llmman.cluster.placement import LOCAL
from llmman.cluster.router import Intent
from llmman.errors import BadRequest, ModelNotFound
from llmman.gateway import ResolvedModel
from llmman.gguf import GGUFInfo, model_info
from llmman.protocol.ollama.fields import parse_json_body
from llmman.protocol.ollama.show import modelfile_extras, parameters_text, stop_tokens
from llmman.protocol.ollama.version import OLLAMA_API_VERSION
from llmman.refs import parse_reference
from llmman.sched.scheduler import LoadedSnapshot
from llmman.store import StoredModel, read_extras
from llmman.store.listing import Listing

FOREVER_YEARS = 292  # Go's max duration, as Ollama shows a model kept forever
_LATEST = datetime(9999, 1, 1, tzinfo=UTC).timestamp()  # later times cannot be formatted


def rfc3339(ts: float, *, local: bool = False) -> str:
    """Unix seconds as RFC 3339 (UTC with ``Z``, or the local offset for ``modified_at``)."""
    moment = datetime.fromtimestamp(min(ts, _LATEST), UTC)
    if local:
        return moment.astimezone().isoformat()
    return moment.isoformat().replace("+00:00", "Z")


def details(info: GGUFInfo | None) -> dict[str, object]:
    """Ollama's ``details`` object from a GGUF header."""
    family = (info.family or info.architecture or "") if info else ""
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": (info.parameter_size or "") if info else "",
        "quantization_level": (info.quantization or "") if info else "",
    }


def _info(services: Services, model: StoredModel) -> GGUFInfo | None:
    try:
        return services.store.info(model)
    except Exception:  # a model whose file cannot be read still lists, with empty details
        return None


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def root(request: Request) -> Response:
    """``GET|HEAD /``: Ollama's liveness text."""
    return PlainTextResponse("Ollama is running")


async def version(request: Request) -> Response:
    """``GET|HEAD /api/version``: the Ollama API level llmman implements, purely numeric as Open WebUI parses
    it (protocol/ollama/version.py); llmman's own version is in the ``x-llmman-version`` header."""
    return json_response({"version": OLLAMA_API_VERSION})


async def tags(request: Request) -> Response:
    """``GET /api/tags``: the store, newest first (the store's kept listing, rendered once per listing)."""
    listing = await stored_listing(_services(request), details=True)
    body = rendered(listing, "/api/tags", None, lambda: orjson.dumps({"models": _tag_entries(listing)}))
    return Response(body, media_type="application/json; charset=utf-8")


#: ``/api/tags`` entries by (name, manifest digest, modified_at, has details): what one entry depends on (the
#: details are the manifest's, fixed by its digest). Only the last rendering's entries are kept.
_TAG_ENTRIES: dict[tuple[str, str, float, bool], dict[str, object]] = {}


def _tag_entries(listing: Listing) -> list[dict[str, object]]:
    """``/api/tags``'s ``models``: every stored model, newest first (an entry rendered for an earlier
    listing is reused: formatting the times is most of the cost)."""
    global _TAG_ENTRIES
    out, kept = [], {}
    for model in sorted(listing.models, key=lambda m: m.modified_at, reverse=True):
        info = listing.info(model.digest)
        key = (model.reference, model.digest, model.modified_at, info is not None)
        entry = _TAG_ENTRIES.get(key) or _tag_entry(model, info)
        kept[key] = entry
        out.append(entry)
    _TAG_ENTRIES = kept
    return out


def _tag_entry(model: StoredModel, info: GGUFInfo | None) -> dict[str, object]:
    """One ``/api/tags`` entry."""
    entry: dict[str, object] = {
        "name": model.reference,
        "model": model.reference,
        "modified_at": rfc3339(model.modified_at, local=True),
        "size": model.size,
        "digest": model.digest.removeprefix("sha256:"),
        "details": details(info),
    }
    if info is not None:
        entry["capabilities"] = list(info.capabilities)
    return entry


async def ps(request: Request) -> Response:
    """``GET /api/ps``: loaded and loading models, latest expiry first; then models that failed (to
    load, or crashed and were not restarted), with ``processor: "failed (CAUSE)"`` and ``failure`` /
    ``error`` fields saying why (sched/failures.py)."""
    services = _services(request)
    now = datetime.now(UTC).timestamp()
    rows = []
    snaps = services.scheduler.snapshot()
    listed = _details_by_digest(services, await stored_listing(services) if snaps else None,
                                {snap.digest for snap in snaps})
    for snap in snaps:
        expires = snap.expires_at if snap.expires_at is not None else now + FOREVER_YEARS * 365.25 * 86400
        if snap.draining:  # a stop (or an eviction) is waiting for its requests: due now, as Ollama shows it
            expires = now
        rows.append(
            (
                expires,
                {
                    "name": snap.reference,
                    "model": snap.reference,
                    "size": snap.memory or snap.size,  # llama-server's own figure, else the estimate
                    "size_vram": snap.memory_device,
                    "digest": snap.digest.removeprefix("sha256:"),
                    "details": listed[snap.digest],
                    "expires_at": rfc3339(expires, local=True),
                    "context_length": snap.n_ctx,
                    "started_at": rfc3339(snap.started_at),
                    "processor": _processor(snap),
                    "pid": snap.pid,
                    **({"draining": True} if snap.draining else {}),
                    **_split_fields(services, snap),
                },
            )
        )
    rows = _one_row_per_model(rows)
    failures = services.scheduler.healer.failures
    for _, row in rows:  # a model that came back after failing says so
        if str(row["name"]) in failures:
            row["failure"] = failures[str(row["name"])].reason()
    loaded = {str(row["name"]) for _, row in rows}
    for key, failure in failures.items():  # failed and not loaded: say why (llmman extension)
        if key not in loaded and not key.endswith("#embedding"):
            rows.append((now, {"name": key, "model": key, "size": 0, "size_vram": 0, "digest": "",
                               "details": {}, "expires_at": rfc3339(now, local=True), "context_length": 0,
                               "processor": f"failed ({failure.cause})", "pid": None,
                               "failure": failure.reason(), "error": failure.message}))
    rows.sort(key=lambda r: r[0], reverse=True)
    return json_response({"models": [r[1] for r in rows]})


def _split_fields(services: Services, snap: LoadedSnapshot) -> dict[str, Any]:
    """A split model's ``split`` (``[{"node", "size"}]``, this node first, by its ``node.name``; its own
    share as llama-server reported it, the workers' as reserved) and ``size``, their sum; {} for a model
    that is not split (docs/split.md)."""
    parts = services.gateway.split_of(snap.reference + "#embedding" if snap.embedding else snap.reference)
    if not parts:
        return {}
    sizes = [(services.settings.node_name if node == LOCAL else node, (snap.memory or size) if node == LOCAL
              else size) for node, size in parts]
    return {"size": sum(size for _, size in sizes), "split": [{"node": n, "size": s} for n, s in sizes]}


def _details_by_digest(services: Services, listing: Listing | None,
                       digests: set[str]) -> dict[str, dict[str, object]]:
    """``details`` of each loaded manifest digest, built from the store's listing as ``/api/tags`` builds
    them (every name of a manifest has the same GGUF; one gone from the store meanwhile gets empty ones)."""
    stored = {m.digest: m for m in listing.models if m.digest in digests} if listing is not None else {}
    return {d: details(_listed_info(services, listing, stored[d]) if listing is not None and d in stored
                       else None) for d in digests}


def _listed_info(services: Services, listing: Listing, model: StoredModel) -> GGUFInfo | None:
    """``model``'s GGUF header: the listing's when it was read with details, else read now."""
    return listing.info(model.digest) if listing.infos is not None else _info(services, model)


def _one_row_per_model(rows: list[tuple[float, dict[str, Any]]]) -> list[tuple[float, dict[str, Any]]]:
    """One ``/api/ps`` entry per model, as Ollama lists them (clients key on ``name``): a model's
    ``--embeddings`` child is folded into its chat child's entry (``size``/``size_vram`` added, the later
    expiry, the chat child's pid and context); an embedding child alone keeps its own entry."""
    merged: dict[str, tuple[float, dict[str, Any]]] = {}
    for expires, row in rows:
        name = str(row["name"])
        if name not in merged:
            merged[name] = (expires, row)
            continue
        kept_expires, kept = merged[name]
        kept_is_embedding = str(kept["processor"]).startswith("llama-server (embedding")
        chat, other = (row, kept) if kept_is_embedding else (kept, row)
        chat = {**chat, "size": chat["size"] + other["size"],
                "size_vram": chat["size_vram"] + other["size_vram"]}
        latest = max(kept_expires, expires)
        chat["expires_at"] = kept["expires_at"] if latest == kept_expires else row["expires_at"]
        merged[name] = (latest, chat)
    return list(merged.values())


def _processor(snap: LoadedSnapshot) -> str:
    """``/api/ps`` ``processor`` (seeds 000/001): ``llama-server``, with ``(embedding)`` for a model's
    ``--embeddings`` child (listed beside its chat child) and ``(loading)`` until it is ready."""
    marks = [word for word, on in (("embedding", snap.embedding), ("loading", not snap.ready)) if on]
    return "llama-server" + (f" ({', '.join(marks)})" if marks else "")


def _model_name(body: dict[str, object]) -> str:
    """``model``, or the legacy ``name`` that older clients still send (Ollama accepts both)."""
    for key in ("model", "name"):
        value = body.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"{key} must be a string")
    raise BadRequest("model is required")


async def show(request: Request) -> Response:
    """``POST /api/show``: details, template, parameters, capabilities and ``model_info``."""
    services = _services(request)
    body = parse_json_body(await request.body())
    name = _model_name(body)
    parse_reference(name, services.settings.aliases)  # 400 invalid model name (llmman.refs grammar, length)
    verbose = body.get("verbose")
    if verbose is not None and not isinstance(verbose, bool):
        raise BadRequest("verbose must be a boolean")  # Ollama's bool field refuses anything else
    # Through the pipeline: with peers, a model stored on another node is described by that node.
    return await run(request, Call(name, partial(_describe, services, verbose is True), Intent.SHOW))


async def _describe(services: Services, verbose: bool, resolved: ResolvedModel) -> Response:
    """``/api/show``'s answer for a model in this node's store."""
    stored = resolved.stored
    info = _info(services, stored)
    n_ctx = services.gateway.context_for(stored, info.context_length if info is not None else None)
    template = (info.chat_template or "") if info else ""
    files = await asyncio.to_thread(services.store.files, stored)  # may hash a fresh import's blob
    stop = stop_tokens(info) if info is not None else []
    extras = read_extras(services.store.layout, stored)  # a derived model's system, parameters, ...
    parameters = parameters_text(n_ctx, stop, extras.parameters)
    modelfile = (
        '# Modelfile generated by "llmman show"\n'
        "# To build a new Modelfile based on this, replace FROM with:\n"
        f"# FROM {stored.reference}\n\nFROM {files.model}\nTEMPLATE \"\"\"{template}\"\"\"\n"
        + "".join(f"PARAMETER {line}\n" for line in parameters.splitlines())
        + modelfile_extras(extras.system, extras.messages, extras.license)
    )
    return json_response(
        {
            "license": "\n".join(extras.license),
            **({"system": extras.system} if extras.system else {}),
            **({"messages": extras.messages} if extras.messages else {}),
            "modelfile": modelfile,
            "parameters": parameters,
            "template": template,
            "details": details(info),
            "model_info": model_info(info, verbose=verbose) if info is not None else {},
            "capabilities": list(info.capabilities) if info is not None else ["completion"],
            "modified_at": rfc3339(stored.modified_at, local=True),
        }
    )


async def delete(request: Request) -> Response:
    """``DELETE /api/delete``: unload if loaded, remove the reference, collect unused blobs."""
    services = _services(request)
    body = parse_json_body(await request.body())
    name = _model_name(body)
    parse_reference(name, services.settings.aliases)  # 400 invalid model name (llmman.refs grammar, length)
    resolved = services.gateway.resolve(name)
    await services.scheduler.unload(resolved.stored.reference)
    services.store.remove(parse_reference(resolved.stored.reference))
    return Response(status_code=200)


async def copy(request: Request) -> Response:
    """``POST /api/copy {source, destination}``: a new name for the same manifest."""
    services = _services(request)
    body = parse_json_body(await request.body())
    source, destination = body.get("source"), body.get("destination")
    if not isinstance(source, str) or not source.strip():
        raise BadRequest("source is required")
    if not isinstance(destination, str) or not destination.strip():
        raise BadRequest("destination is required")
    aliases = services.settings.aliases
    parse_reference(source, aliases)  # 400 invalid model name (llmman.refs grammar, length)
    target = parse_reference(destination, aliases)
    try:
        resolved = services.gateway.resolve(source)
    except ModelNotFound as exc:
        raise ModelNotFound(source) from exc
    if target.digest is not None:
        raise BadRequest(f"invalid destination {destination!r}: a copy is named by a tag, not a digest")
    services.store.tag(parse_reference(resolved.stored.reference), target)
    return Response(status_code=200)

