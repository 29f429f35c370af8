"""Checking an Ollama ``POST /api/create`` body before any work starts (Ollama's ``api.CreateRequest``).

Every field Ollama defines is type-checked (400 with Ollama's wording for a bad value): ``model`` (a name
llmman.refs accepts), ``from`` (string), ``files``/``adapters`` (objects of file name -> digest string),
``quantize``/``template``/``system`` (strings), ``license`` (string or array of strings), ``messages``
(array of ``{role, content}`` objects), ``parameters`` (an object of known Ollama options of the right
types: ``unknown parameter 'x'`` otherwise), ``stream`` (boolean).

``system``, ``parameters``, ``messages`` and ``license`` make a derived model (:mod:`llmman.store.derive`,
applied per request by :mod:`llmman.protocol.model_defaults`). Fields llmman cannot honour (``quantize``,
``adapters``, ``template``, when non-empty) are refused with 501 rather than silently dropped, so a client
never believes a model carries something it does not: llama-server renders prompts with the GGUF's own
Jinja chat template and cannot take Ollama's Go templates, LoRA adapters are not packaged, and llmman does
not quantize (use a GGUF already quantized).

A ``from`` that is a server path (``/models/x.gguf``) is read only under the directories the operator
allowed (``server.import_dirs``, empty by default: :func:`server_source`); everything else gets one 403
whatever the path, so the route tells nothing about the server's files. Inside an allowed folder only
the entries that themselves resolve inside an allowed directory are packaged (:func:`allowed_entries`):
a ``README`` symlinked to ``/etc/shadow`` is never copied into the store, where ``/v2`` would serve it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from llmman.errors import BadRequest, LlmmanError, NotFound, NotImplementedHere
from llmman.protocol.ollama.fields import options_to_sampling, runner_options, unknown_options

UNSUPPORTED = {
    "quantize": "llmman does not quantize; create from a GGUF that is already quantized",
    "adapters": "LoRA adapters are not supported",
    "template": "llama-server uses the chat template inside the GGUF (Jinja); Go templates are not supported",
}


def _string_map(body: dict[str, object], key: str) -> None:
    value = body.get(key)
    if value is None:
        return
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise BadRequest(f"{key} must be an object of file names to sha256 digests")


def check_create_body(body: dict[str, object]) -> None:
    """Raise BadRequest (400) for a wrongly typed field or an invalid ``parameters`` entry, LlmmanError
    (501) for a non-empty ``quantize``, ``adapters`` or ``template``; see the module docstring."""
    for key in ("from", "quantize", "template", "system"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise BadRequest(f"{key} must be a string")
    _string_map(body, "files")
    _string_map(body, "adapters")
    license_ = body.get("license")
    if license_ is not None and not isinstance(license_, str) and not (
            isinstance(license_, list) and all(isinstance(x, str) for x in license_)):
        raise BadRequest("license must be a string or an array of strings")
    messages = body.get("messages")
    if messages is not None and not (isinstance(messages, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str)
            for m in messages)):
        raise BadRequest("messages must be an array of {role, content} objects")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise BadRequest("stream must be a boolean")
    parameters = body.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise BadRequest("parameters must be an object")
        unknown = unknown_options(parameters)
        if unknown:
            raise BadRequest(f"unknown parameter '{unknown[0]}'")
        options_to_sampling(parameters)  # raises: option "x" must be of type ...
        runner_options(parameters)
    for key, why in UNSUPPORTED.items():
        if body.get(key):
            raise NotImplementedHere(f"'{key}' in /api/create is not supported by llmman: {why}")


#: The one answer for every server path outside ``server.import_dirs`` (existing or not).
NOT_ALLOWED = ("'from' names a path on the server, and this server reads none there (server.import_dirs, "
               "LLMMAN_IMPORT_DIRS): upload the files with POST /api/blobs/sha256:<digest> and name them in "
               "'files'")


class ImportNotAllowed(LlmmanError):
    """A server path outside ``server.import_dirs`` (403)."""

    status = 403
    code = "import_not_allowed"

    def __init__(self) -> None:
        super().__init__(NOT_ALLOWED)


def _roots(import_dirs: Iterable[str]) -> list[Path]:
    """The allowed directories, resolved; relative entries are ignored (they would depend on the cwd)."""
    return [Path(d).expanduser().resolve() for d in import_dirs if Path(d).expanduser().is_absolute()]


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def server_source(source: str, import_dirs: Iterable[str]) -> Path:
    """The real path (symlinks and ``..`` resolved) of a server-path ``from``, when it lies under one of
    ``import_dirs``.

    Raises:
        ImportNotAllowed: outside every allowed directory, or none allowed; the same whether it exists.
        NotFound: inside one, but nothing is there.
    """
    roots = _roots(import_dirs)
    if not roots:
        raise ImportNotAllowed()
    try:
        real = Path(source).resolve()
    except (OSError, RuntimeError):  # a symlink loop, an unreadable component
        raise ImportNotAllowed() from None
    if not _inside(real, roots):
        raise ImportNotAllowed()
    if not real.exists():
        raise NotFound(f"{source}: no such file or directory")
    return real


def allowed_entries(folder: Path, import_dirs: Iterable[str]) -> dict[str, Path]:
    """The files of an allowed ``folder`` to package, by name -> real path: regular files whose real path
    is under an allowed directory too (a symlink out of it is left out, as are subfolders)."""
    roots = _roots(import_dirs)
    out: dict[str, Path] = {}
    for entry in sorted(folder.iterdir()):
        try:
            real = entry.resolve()
        except (OSError, RuntimeError):
            continue
        if real.is_file() and _inside(real, roots):
            out[entry.name] = real
    return out
