"""Verbs about stored models: ``list``/``ls``, ``rm``, ``tag``/``cp``, ``show``, ``inspect``, ``build``,
``verify``.

``list``, ``rm``, ``tag``, ``show`` and ``verify`` go through the daemon when one answers (so ``rm`` unloads a
loaded model first and the daemon's caches stay right), else they use the store directly. An explicit
``--store DIR`` always means that store, directly: the daemon may be serving another one. ``inspect``
and ``build`` always work on the store.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmman.cli.client import DaemonClient, client_for
from llmman.errors import LlmmanError, ModelNotFound, NotFound
from llmman.refs import Reference, parse_reference

if TYPE_CHECKING:
    from llmman.config.settings import Settings
    from llmman.gguf import GGUFInfo
    from llmman.store import Store

__all__ = ["cmd_build", "cmd_inspect", "cmd_list", "cmd_rm", "cmd_show", "cmd_tag", "cmd_verify",
           "matches_filter"]


def _daemon(args: argparse.Namespace, settings: Settings) -> DaemonClient | None:
    """A client of the daemon when one answers and no explicit ``--store`` was given, else None."""
    if getattr(args, "store", None):
        return None
    client = client_for(settings)
    if client.ping():
        return client
    client.close()
    return None


def _store(settings: Settings) -> Store:
    from llmman.store import Store

    return Store(settings.models)


def _ref(text: str, settings: Settings) -> Reference:
    return parse_reference(text, settings.aliases)


def _get(store: Store, ref: Reference) -> Any:
    model = store.get(ref)
    if model is None:
        raise ModelNotFound(str(ref))
    return model


def matches_filter(name: str, filter_ref: Reference, tagged: bool) -> bool:
    """True when the listed ``name`` matches the filter: the same reference when the filter had a tag,
    else the same repository with any tag (case-insensitive, as Ollama matches names)."""
    try:
        ref = parse_reference(name)
    except LlmmanError:
        return name.lower() == str(filter_ref).lower()
    if tagged:
        return ref.key() == filter_ref.key()
    return ref.host_repository.lower() == filter_ref.host_repository.lower()


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman list [FILTER]``: NAME ID SIZE MODIFIED, newest first; only the header when empty."""
    from llmman.cli.tables import list_table

    client = _daemon(args, settings)
    if client is not None:
        with client:
            models = client.tags()
    else:
        models = [
            {"name": str(m.reference), "digest": m.digest, "size": m.size, "modified_at": m.modified_at}
            for m in _store(settings).list()
        ]
        models.sort(key=lambda m: float(m["modified_at"] or 0), reverse=True)
    if args.filter:
        wanted = _ref(args.filter, settings)
        last = args.filter.strip().rsplit("/", 1)[-1]
        tagged = ":" in last or "@" in last
        models = [m for m in models if matches_filter(str(m.get("name") or ""), wanted, tagged)]
    sys.stdout.write(list_table(models, datetime.now(UTC)))
    return 0


def cmd_rm(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman rm REF...``: delete each; report each failure and exit 1 after trying them all."""
    client = _daemon(args, settings)
    failed = False
    for text in args.refs:
        name = text
        try:
            ref = _ref(text, settings)
            name = str(ref)
            if client is not None:
                answer = client.delete(str(ref))
                if answer.get("unloaded"):
                    print(f"Unloaded {ref}")
            else:
                _store(settings).remove(ref)
            print(f"Deleted {ref}")
        except ModelNotFound:
            failed = True
            print(f"Error: model '{name}' not found", file=sys.stderr)
        except LlmmanError as exc:
            failed = True
            print(f"Error: {exc}", file=sys.stderr)
    if client is not None:
        client.close()
    return 1 if failed else 0


def cmd_tag(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman tag|cp SRC DST``: give a stored model another name."""
    src, dst = _ref(args.source, settings), _ref(args.destination, settings)
    client = _daemon(args, settings)
    if client is not None:
        with client:
            client.copy(str(src), str(dst))
    else:
        _store(settings).tag(src, dst)
    print(f"Copied {src} to {dst}")
    return 0


def _show_from_info(info: GGUFInfo, ref: Reference) -> dict[str, Any]:
    """An ``/api/show``-shaped answer from the GGUF header, for when no daemon runs."""
    arch = info.architecture
    meta: dict[str, object] = {
        k: v for k, v in info.metadata.items()
        if isinstance(v, str | int | float | bool) and k not in ("tokenizer.chat_template", "general.name")
    }
    meta.update({"general.architecture": arch, f"{arch}.context_length": info.context_length,
                 f"{arch}.embedding_length": info.embedding_length})
    template = info.chat_template or ""
    modelfile = f'# Modelfile generated by "llmman show"\nFROM {ref}\n'
    if template:
        modelfile += f'TEMPLATE """{template}"""\n'
    return {
        "modelfile": modelfile,
        "parameters": "",
        "template": template,
        "license": str(info.metadata.get("general.license") or ""),
        "details": {"format": "gguf", "family": info.family, "parameter_size": info.parameter_size,
                    "quantization_level": info.quantization},
        "model_info": {k: v for k, v in meta.items() if v is not None},
        "capabilities": list(info.capabilities),
    }


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman show MODEL [--modelfile|--parameters|--template|--license] [--verbose]``."""
    from llmman.cli.tables import format_show

    ref = _ref(args.model, settings)
    client = _daemon(args, settings)
    if client is not None:
        with client:
            data = client.show(str(ref), verbose=args.verbose)
    else:
        store = _store(settings)
        model = _get(store, ref)
        data = _show_from_info(store.info(model), ref)
        from llmman.protocol.ollama.show import options_text
        from llmman.store import read_extras

        extras = read_extras(store.layout, model)  # a derived model's system prompt, parameters, ...
        data.update(license="\n".join(extras.license) or data["license"],
                    parameters=options_text(extras.parameters))
        data.update({k: v for k, v in (("system", extras.system), ("messages", extras.messages)) if v})
    for part in ("modelfile", "parameters", "template", "license"):
        if getattr(args, part):
            text = str(data.get(part) or "")
            sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
            return 0
    sys.stdout.write(format_show(data, verbose=args.verbose) + "\n")
    return 0


def cmd_inspect(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman inspect REF``: the stored OCI manifest, pretty-printed with a 2-space indent."""
    model = _get(_store(settings), _ref(args.ref, settings))
    print(json.dumps(model.manifest, indent=2))
    return 0


def cmd_build(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman build -t REF [-l K=V]... PATH``: package local GGUF files into the store."""
    ref = _ref(args.tag, settings)
    path = Path(args.path)
    if not path.exists():
        raise NotFound(f"{path}: no such file or directory")
    model = _store(settings).build(ref, path, dict(args.label))
    print(f"Built {ref} ({model.digest})")
    return 0


def _verify_line(line: dict[str, Any], tally: dict[str, int]) -> None:
    """Print one line of ``/api/verify`` (:mod:`llmman.registry.fsck`): bad blobs and repairs on stdout,
    errors on stderr, good blobs only counted."""
    from llmman.cli.commands_pull import _human

    status = str(line.get("status") or "")
    if line.get("error") and not status:
        raise LlmmanError(str(line["error"]))
    if status == "done":
        tally.update(checked=int(line.get("checked") or 0), bad=int(line.get("bad") or 0),
                     repaired=int(line.get("repaired") or 0))
    elif status in ("corrupt", "missing"):
        size = int(line.get("size") or 0)
        models = ", ".join(str(m) for m in line.get("models") or [])
        what = "corrupt (removed)" if status == "corrupt" else "missing"
        print(f"{what:<18} {str(line.get('digest'))[:19]}  {_human(size) if size > 0 else '-':>9}  {models}")
    elif status.startswith(("repairing ", "repaired ")):
        print(status)
    elif status.startswith("not repaired "):
        print(f"{status}: {line.get('error')}", file=sys.stderr)


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman verify [MODEL...] [--repair]``: hash every blob of the store (or of the models) against its
    digest; report the bad ones; with ``--repair`` fetch them again. Exit 1 when any is still bad."""
    refs = [_ref(text, settings) for text in args.models] or None
    tally = {"checked": 0, "bad": 0, "repaired": 0}
    client = _daemon(args, settings)
    if client is not None:
        with client:
            body: dict[str, Any] = {"repair": bool(args.repair)}
            if refs:
                body["models"] = [str(r) for r in refs]
            for line in client.ndjson_stream("/api/verify", body):
                _verify_line(line, tally)
    else:
        from llmman.registry.fsck import verify_store

        puller = None
        if args.repair:
            from llmman.registry.client import RegistryOptions
            from llmman.registry.credentials import CredentialStore
            from llmman.registry.puller import Puller

            puller = Puller(_store(settings), CredentialStore.of(settings), offline=settings.offline,
                            options=RegistryOptions.of(settings))
        verify_store(_store(settings), refs, lambda line: _verify_line(line, tally), repair=args.repair,
                     puller=puller)
    bad, repaired = tally["bad"], tally["repaired"]
    summary = f"{tally['checked']} blobs checked: "
    summary += f"{bad} bad" if bad else "all good"
    print(summary + (f", {repaired} repaired" if repaired else ""))
    return 1 if bad else 0
