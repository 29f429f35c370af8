"""``llmman create NAME [-f Modelfile]``: a model from an Ollama Modelfile, made by the daemon's
``/api/create``.

As Ollama's CLI does it (``cmd/cmd.go`` CreateHandler): the Modelfile is read here
(:mod:`llmman.cli.modelfile`); a ``FROM`` naming a local GGUF file (or a folder of them) is hashed, uploaded
with ``POST /api/blobs/<digest>`` unless the daemon already has it (``HEAD``), and named in ``files``; then
``POST /api/create`` streams its progress. The lines are those of ``llmman pull``
(:class:`llmman.cli.commands_pull.ProgressView`): ``gathering model components``, a bar per uploaded file
(``copying file sha256:…``; with stderr not a terminal, the line ``copying file sha256:… 100%`` once it is
sent), then the daemon's statuses, ending with ``success``. A daemon is started when
none answers, as for ``llmman run``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from llmman.cli.autostart import ensure_server
from llmman.cli.client import DaemonClient, Upload
from llmman.cli.modelfile import CreateRequest, check_template, create_body, parse_modelfile
from llmman.errors import BadRequest, LlmmanError
from llmman.refs import parse_reference

if TYPE_CHECKING:
    from llmman.cli.commands_pull import ProgressView
    from llmman.config.settings import Settings

__all__ = ["cmd_create", "file_digest", "file_name", "upload_files"]

_BLOCK = 1 << 20


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of the file at ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def file_name(path: Path) -> str:
    """The name a file gets in ``files``: its own, with ``.gguf`` added to a GGUF that lacks it (a store's
    blob, as the ``FROM`` of ``llmman show --modelfile`` names it), since the daemon packages ``*.gguf``."""
    if path.suffix.lower() == ".gguf":
        return path.name
    with path.open("rb") as f:
        magic = f.read(4)
    return f"{path.name}.gguf" if magic == b"GGUF" else path.name


def upload_files(client: DaemonClient, paths: list[Path], view: ProgressView) -> dict[str, str]:
    """Upload each file the daemon does not have yet; returns ``files`` (name -> digest) for
    ``/api/create``.

    Raises:
        BadRequest: two files with the same name (``files`` is keyed by name).
    """
    files: dict[str, str] = {}
    for path in paths:
        name = file_name(path)
        if name in files:
            raise BadRequest(f"two files named {name!r}: {path} and another")
        digest = file_digest(path)
        files[name] = digest
        size = path.stat().st_size
        status = f"copying file {digest}"
        if client.blob_exists(digest):
            view({"status": status, "digest": digest, "total": size, "completed": size})
            continue
        view({"status": status, "digest": digest, "total": size, "completed": 0})

        def progress(sent: int, digest: str = digest, size: int = size, status: str = status) -> None:
            view({"status": status, "digest": digest, "total": size, "completed": sent})

        client.upload_blob(digest, Upload(path, progress))
        if not _isatty(sys.stderr):  # no bar was drawn: Ollama's last words for the file, once
            view({"status": f"{status} 100%"})
    return files


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _own_template(client: DaemonClient, request: CreateRequest) -> str | None:
    """The chat template of the model a Modelfile builds on: a local GGUF's own (the first that has one),
    else the stored model's (``/api/show``); None when it has none or cannot be read."""
    if request.paths:
        from llmman.gguf import read_gguf

        for path in request.paths:
            try:
                template = read_gguf(path).chat_template
            except (LlmmanError, OSError, ValueError):
                continue
            if template:
                return template
        return None
    source = request.body.get("from")
    if not isinstance(source, str):
        return None
    try:
        template = client.show(source).get("template")
    except LlmmanError:
        return None
    return template if isinstance(template, str) else None


def cmd_create(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman create NAME [-f FILE] [-q QUANT]``: see the module docstring. The Modelfile is read and
    checked before a daemon is asked anything."""
    from llmman.cli.commands_pull import ProgressView

    path = Path(args.file).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadRequest(f"no Modelfile at {path} (name one with -f)") from None
    except UnicodeDecodeError:
        raise BadRequest(f"{path}: not a UTF-8 text file") from None
    ref = parse_reference(args.model, settings.aliases)
    request = create_body(parse_modelfile(text), path.resolve().parent)
    body: dict[str, Any] = {"model": str(ref), **request.body}
    if args.quantize:
        body["quantize"] = args.quantize  # the daemon refuses it, with its reason
    client = ensure_server(settings, store=getattr(args, "store", None))
    if request.template is not None:
        check_template(request, _own_template(client, request))
    with client, ProgressView() as view:
        view({"status": "gathering model components"})
        if request.paths:
            body["files"] = upload_files(client, request.paths, view)
        for line in client.ndjson_stream("/api/create", body):
            view(line)
    if not view.success:
        raise LlmmanError("the daemon ended the create without success")
    return 0
