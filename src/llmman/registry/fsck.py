"""``llmman verify``: hash every blob of the store (or of the named models), report the bad ones, and with
``repair`` fetch them again from each model's registry (docs/store.md).

:func:`verify_store` emits Ollama-style NDJSON lines, the same from the daemon (``POST /api/verify``) and
from the CLI working on the store directly:

* ``{"status": "ok"|"corrupt"|"missing", "digest", "size", "models"}`` per blob (a corrupt blob has been
  removed from the store: under its name it could only be wrong);
* with ``repair``, per model that lost a blob: ``{"status": "unloaded <name>"}`` when the daemon had it
  loaded (its child maps the bad bytes), ``{"status": "repairing <name>"}``, the pull's progress lines,
  then ``{"status": "repaired <name>"}`` or ``{"status": "not repaired <name>", "error": …}``;
* last ``{"status": "done", "checked", "bad", "repaired"}``: ``bad`` counts the blobs still bad.

A model is repaired by pulling its stored manifest digest (``name@sha256:…``; a Hugging Face model by its
tag) through the :class:`Puller`, which fetches only what is missing and verifies it; offline rules apply.
When that fails, each of ``sources`` is tried in turn (the daemon passes one per peer: a copy from its
``/v2/``, pinned to the same digest).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from llmman.errors import LlmmanError
from llmman.refs import HF_REGISTRY, Reference, parse_reference
from llmman.registry.puller import Emit, Puller
from llmman.store import BlobCheck, Store

__all__ = ["Source", "verify_store"]

Source = Callable[[Reference], object]  # fetches the missing blobs of a pinned reference; raises on failure


def _line(check: BlobCheck) -> dict[str, object]:
    return {"status": check.state, "digest": check.digest, "size": check.size, "models": list(check.models)}


def verify_store(store: Store, refs: Iterable[Reference] | None, emit: Emit, *, repair: bool = False,
                 puller: Puller | None = None, sources: Sequence[Source] = (),
                 unload: Callable[[str], bool] | None = None) -> int:
    """Check (and with ``repair`` and a ``puller``, repair) the blobs; returns how many are still bad.
    ``unload(name)`` stops a loaded model before its blobs are fetched again (True when it was loaded).

    Raises ModelNotFound for a ref that names no stored model (before anything is checked)."""
    wanted = list(refs) if refs is not None else None
    entries = store.entries(wanted)
    results = store.check(wanted, on_blob=lambda c: emit(_line(c)))
    bad = [c for c in results if c.state != "ok"]
    repaired = 0
    if repair and bad and puller is not None:
        broken = sorted({name for c in bad for name in c.models})
        digests = dict(entries)
        still_bad: set[str] = set()
        for name in broken:
            if unload is not None and unload(name):
                emit({"status": f"unloaded {name}"})
            emit({"status": f"repairing {name}"})
            try:
                ref = parse_reference(name)
            except LlmmanError as exc:
                emit({"status": f"not repaired {name}", "error": str(exc)})
                continue
            pinned = replace(ref, digest=digests[name])
            error = _repair(puller, ref if ref.registry == HF_REGISTRY else pinned, pinned, sources, emit)
            if error is None:  # what was just fetched or hashed has fresh records: a stat each
                left = [c.digest for c in store.check([ref], force=False) if c.state != "ok"]
                error = f"still bad: {', '.join(d[:19] for d in left)}" if left else None
            if error is not None:
                still_bad.add(name)
                emit({"status": f"not repaired {name}", "error": error})
                continue
            emit({"status": f"repaired {name}"})
        repaired = sum(1 for c in bad if not still_bad & set(c.models))
    remaining = len(bad) - repaired
    emit({"status": "done", "checked": len(results), "bad": remaining, "repaired": repaired})
    return remaining


def _repair(puller: Puller, ref: Reference, pinned: Reference, sources: Sequence[Source],
            emit: Emit) -> str | None:
    """Pull ``ref`` from its registry, else from each source in turn; None on success, else the first
    failure's reason."""
    try:
        puller.pull(ref, lambda line: emit(line) if line.get("status") != "success" else None)
        return None
    except (LlmmanError, OSError) as exc:
        first = str(exc)
    for source in sources:
        try:
            source(pinned)
            return None
        except (LlmmanError, OSError):
            continue
    return first
