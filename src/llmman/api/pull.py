"""Ollama's transfer routes: ``/api/pull``, ``/api/push``, ``/api/create``, ``HEAD``/``POST /api/blobs/:d``.

Shapes (Ollama's ``api.ProgressResponse``): pull and push stream ``application/x-ndjson`` status lines (see
:mod:`llmman.registry.puller` and :mod:`llmman.registry.push`) ending with ``{"status": "success"}``; an
error after the stream started is an in-band ``{"error": "..."}`` line. ``"stream": false`` answers
once at the end: ``{"status": "success"}``, or the error with its HTTP status (404 for a repository the
registry does not have, 401 for refused credentials, 502/503 for registry failures). A stream carries
``X-Accel-Buffering: no`` and ``Cache-Control: no-cache`` (:data:`STREAM_HEADERS`), so a reverse proxy
hands each progress line on at once.

The work runs in a worker thread (the registry client is synchronous); its progress crosses to the
event loop through an asyncio queue. A client that goes away does not cancel a pull: it completes for
whoever asks next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from llmman.api.create_body import allowed_entries, check_create_body, server_source
from llmman.api.ollama_infer import NDJSON, json_response
from llmman.api.services import Services
from llmman.errors import BadRequest, LlmmanError, ModelNotFound, NotFound, NotImplementedHere
from llmman.protocol.ollama.fields import parse_json_body
from llmman.refs import parse_reference
from llmman.registry.puller import Emit, Puller
from llmman.store import derive_model
from llmman.store.layout import digest_hex

if TYPE_CHECKING:
    from llmman.refs import Reference
    from llmman.store import Store

log = logging.getLogger("llmman.api.pull")
Job = Callable[[Emit], object]
_END = object()
STREAM_HEADERS = {"X-Accel-Buffering": "no", "Cache-Control": "no-cache"}
"""On every progress stream: a proxy (nginx) passes each line as it comes, and nothing caches it."""


def _puller(services: Services) -> Puller:
    if services.puller is None:
        raise NotImplementedHere("this server cannot pull or push (no registry client configured)")
    return services.puller


def _model_field(body: dict[str, object]) -> str:
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise BadRequest("model is required")
    return name


def _flags(body: dict[str, object]) -> tuple[bool, bool]:
    """``(insecure, stream)`` of a pull or push body (defaults False, True). Raises BadRequest (400,
    ``insecure must be a boolean``) for a present non-boolean, as the other routes do."""
    for key in ("insecure", "stream"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise BadRequest(f"{key} must be a boolean")
    return body.get("insecure") is True, body.get("stream") is not False


async def _run(job: Job, stream: bool) -> Response:
    """Run ``job(emit)`` in a thread; stream its lines, or answer once with the outcome."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[object] = asyncio.Queue()

    def emit(line: dict[str, Any]) -> None:
        loop.call_soon_threadsafe(lines.put_nowait, line)

    if not stream:
        await asyncio.to_thread(job, lambda _line: None)
        return json_response({"status": "success"})

    async def work() -> None:
        try:
            await asyncio.to_thread(job, emit)
        except LlmmanError as exc:
            lines.put_nowait({"error": exc.message})
        except OSError as exc:
            lines.put_nowait({"error": f"{exc.strerror or exc}"})
        except Exception as exc:  # a bug: still an in-band error line, never a broken stream
            log.exception("transfer job failed")
            lines.put_nowait({"error": f"internal error: {type(exc).__name__}: {exc}"})
        finally:
            lines.put_nowait(_END)

    task = asyncio.create_task(work())

    async def body() -> AsyncIterator[bytes]:
        while (line := await lines.get()) is not _END:
            yield orjson.dumps(line) + b"\n"
        await task

    return StreamingResponse(body(), media_type=NDJSON, headers=STREAM_HEADERS)


async def pull(request: Request) -> Response:
    """``POST /api/pull {"model", "insecure"?, "stream"?}``."""
    services: Services = request.app.state.services
    body = parse_json_body(await request.body())
    ref = parse_reference(_model_field(body), services.settings.aliases)
    insecure, stream = _flags(body)
    puller = _puller(services)
    return await _run(lambda emit: puller.pull(ref, emit, insecure=insecure), stream)


async def push(request: Request) -> Response:
    """``POST /api/push {"model", "insecure"?, "stream"?}``; 404 when the model is not stored."""
    services: Services = request.app.state.services
    body = parse_json_body(await request.body())
    name = _model_field(body)
    ref = parse_reference(name, services.settings.aliases)
    insecure, stream = _flags(body)
    if services.store.find(ref) is None:
        raise ModelNotFound(name)
    puller = _puller(services)
    return await _run(lambda emit: puller.push(ref, emit, insecure=insecure), stream)


def _digest(request: Request) -> str:
    digest = str(request.path_params["digest"]).replace("sha256-", "sha256:", 1)
    try:
        digest_hex(digest)
    except LlmmanError as exc:
        raise BadRequest(exc.message) from exc
    return digest


async def blob_head(request: Request) -> Response:
    """``HEAD /api/blobs/:digest``: 200 when the store has it, verified (a client skips the upload on
    200), else 404."""
    services: Services = request.app.state.services
    state = await asyncio.to_thread(services.store.layout.verify_blob, _digest(request))
    return Response(status_code=200 if state == "ok" else 404)


async def blob_upload(request: Request) -> Response:
    """``POST /api/blobs/:digest``: store the body, verified against the digest; 201, or 400 on mismatch."""
    services: Services = request.app.state.services
    digest = _digest(request)
    chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=64)

    def consume() -> None:
        def source() -> Any:
            while (chunk := chunks.get()) is not None:
                yield chunk

        services.store.write_blob(source(), digest)

    def feed(chunk: bytes | None) -> None:
        """Hand ``chunk`` to the writer; gives up once the writer has stopped (a full disk, say), which
        would otherwise leave this put blocked on a queue nobody reads."""
        while not writer.done():
            with contextlib.suppress(queue.Full):
                chunks.put(chunk, timeout=0.5)
                return

    writer = asyncio.create_task(asyncio.to_thread(consume))
    try:
        async for chunk in request.stream():
            if chunk:
                await asyncio.to_thread(feed, chunk)
            if writer.done():
                break
        await asyncio.to_thread(feed, None)
        await writer
    except LlmmanError as exc:
        raise BadRequest(exc.message) from exc
    finally:
        if not writer.done():  # the client went away: end the stream so the writer drops its temp file
            with contextlib.suppress(queue.Empty):
                while True:
                    chunks.get_nowait()
            with contextlib.suppress(queue.Full):
                chunks.put_nowait(None)
        # Its digest mismatch (a truncated body) is expected then: retrieve it, or asyncio logs
        # "Task exception was never retrieved" when the task is collected.
        writer.add_done_callback(_retrieve)
    return Response(status_code=201)


def _retrieve(task: asyncio.Future[None]) -> None:
    """Mark a finished writer task's outcome as seen (an exception was answered or nobody is asking)."""
    if not task.cancelled():
        task.exception()


def _create_files(store: Store, files: dict[str, object]) -> dict[str, Path]:
    """``files`` of ``/api/create`` checked before anything streams: plain file names (400 otherwise) mapped
    to the paths of uploaded blobs (``sha256:<hex>`` or ``sha256-<hex>``; 400 when malformed, 404 when
    not uploaded)."""
    paths: dict[str, Path] = {}
    for name, digest in files.items():
        if not name or name in (".", "..") or Path(name).name != name:
            raise BadRequest(f"invalid file name {name!r} in 'files'")
        if not isinstance(digest, str):
            raise BadRequest(f"invalid digest for {name!r} in 'files'")
        digest = digest.replace("sha256-", "sha256:", 1)
        try:
            path = store.blob_path(digest)
        except LlmmanError as exc:
            raise BadRequest(exc.message) from exc
        if not path.is_file():
            raise NotFound(f"blob {digest} not found: upload it with POST /api/blobs/{digest}")
        paths[name] = path
    return paths


def _derived_fields(body: dict[str, object]) -> dict[str, Any]:
    """The non-empty ``system``/``parameters``/``messages``/``license`` of a checked create body, as
    keyword arguments of :func:`llmman.store.derive_model` (``license`` always a list, messages as
    ``{role, content}``)."""
    out: dict[str, Any] = {}
    if body.get("system"):
        out["system"] = body["system"]
    if body.get("parameters"):
        out["parameters"] = body["parameters"]
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        out["messages"] = [{"role": str(m["role"]).lower(), "content": m.get("content") or ""}
                           for m in messages]
    license_ = body.get("license")
    if isinstance(license_, str) and license_:
        out["license"] = [license_]
    elif isinstance(license_, list) and license_:
        out["license"] = [str(text) for text in license_]
    return out


def _build_from_server_path(store: Store, ref: Reference, real: Path, import_dirs: tuple[str, ...]) -> None:
    """``from`` a server path, already checked by :func:`~llmman.api.create_body.server_source`: a file as
    it is, a folder from a view holding only its entries that resolve inside ``server.import_dirs``."""
    if real.is_file():
        store.build(ref, real)
        return
    with tempfile.TemporaryDirectory(prefix="llmman-create-") as tmp:
        for name, path in allowed_entries(real, import_dirs).items():
            (Path(tmp) / name).symlink_to(path)
        store.build(ref, Path(tmp))


async def create(request: Request) -> Response:
    """``POST /api/create {"model", "from"? , "files"?: {name: digest}, "system"?, "parameters"?,
    "messages"?, "license"?, "stream"?}``.

    ``from`` is a stored model (tagged as ``model``) or a local GGUF file or folder on the server;
    ``files`` names blobs uploaded with ``POST /api/blobs`` (packaged like ``llmman build``). With
    ``system``, ``parameters``, ``messages`` or ``license`` the result is a derived model: the base's
    layers plus small layers for those (:mod:`llmman.store.derive`), inherited from a derived base.
    The body is checked first (:func:`llmman.api.create_body.check_create_body`: 400 for bad fields,
    501 for ``quantize``, ``adapters``, ``template``)."""
    services: Services = request.app.state.services
    body = parse_json_body(await request.body())
    ref = parse_reference(_model_field(body), services.settings.aliases)
    check_create_body(body)
    source, files = body.get("from"), body.get("files")
    store = services.store
    derived = _derived_fields(body)

    blobs = _create_files(store, files) if isinstance(files, dict) and files else None
    # A server path is judged before anything streams: 403 outside server.import_dirs, existing or not.
    server_path = server_source(source, services.settings.import_dirs) \
        if not blobs and isinstance(source, str) and source.startswith("/") else None

    def job(emit: Emit) -> None:
        emit({"status": "parsing model"})
        base = ref
        if blobs:
            with tempfile.TemporaryDirectory(prefix="llmman-create-") as tmp:
                for name, path in blobs.items():
                    (Path(tmp) / name).symlink_to(path)
                store.build(ref, Path(tmp))
        elif server_path is not None:
            _build_from_server_path(store, ref, server_path, services.settings.import_dirs)
        elif isinstance(source, str) and source:
            base = parse_reference(source, services.settings.aliases)
            if not derived:
                store.tag(base, ref)
        else:
            raise BadRequest("neither 'from' nor 'files' was given")
        if derived:
            emit({"status": "creating new layers"})
            derive_model(store, base, ref, **derived)
        emit({"status": "writing manifest"})
        emit({"status": "success"})

    return await _run(job, body.get("stream") is not False)
